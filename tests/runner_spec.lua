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

-- A child started from inside an mpiexec'd rank must not see its parent's process-manager
-- variables, or MPI_Init in the child would try to join the parent's job.
local CLEAN = [[for v in $(env | sed -n 's/^\(PMI_[^=]*\|PMIX_[^=]*\|HYDI_[^=]*\|HYDRA_[^=]*\|MPIR_[^=]*\|MPI_LOCAL[^=]*\|OMPI_[^=]*\)=.*/\1/p'); do unset "$v"; done; ]]

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

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

    it("fails the tests of a block whose setup failed, and a failing teardown", function()
      local r = tpsh_test("-o plain " .. FIX .. "hooks_fixture.lua")
      assert.are.equal(1, r.code, r.out)
      assert.is_true(has(r, "^FAIL setup breaks first"), r.out)
      assert.is_true(has(r, "^FAIL setup breaks second"), r.out)
      assert.is_true(has(r, "^PASS teardown breaks runs$"), r.out)
      assert.is_true(has(r, "^FAIL teardown breaks %(teardown%)"), r.out)
      assert.are.equal("1 passed, 3 failed, 0 skipped", last(r), r.out)
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
    it("is one well-formed testsuite followed by the summary", function()
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
      assert.are.equal("2 passed, 3 failed, 1 skipped", last(r))
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

    it("--repeat runs everything again", function()
      local r = tpsh_test("-o plain --repeat 3 " .. FIX .. "pass_fixture.lua")
      assert.are.equal("9 passed, 0 failed, 3 skipped", last(r), r.out)
    end)

    it("--shuffle --seed gives a reproducible order and prints the seed", function()
      local a = tpsh_test("-o plain --shuffle --seed 7 " .. FIX .. "fail_fixture.lua")
      local b = tpsh_test("--seed 7 -o plain " .. FIX .. "fail_fixture.lua")
      assert.is_true(has(a, "seed 7"), a.out)
      assert.are.same(a.lines, b.lines)
    end)

    it("rejects an unknown option with a non-zero status", function()
      local r = tpsh_test("--no-such-option")
      assert.are_not.equal(0, r.code)
      assert.is_true(has(r, "unknown option"), r.out)
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
  end)

  describe("assert.tensor_close", function()
    it("shows shapes, dtypes and the max abs diff", function()
      if not tp.ones then pending("no tensors in this build") end
      local r = tpsh_test("-o plain " .. FIX .. "tensor_fixture.lua")
      assert.are.equal("2 passed, 2 failed, 0 skipped", last(r), r.out)
      assert.is_true(has(r, "^FAIL tensor fixture reports far tensors"), r.out)
      assert.is_true(has(r, "shape {2,3} dtype f32"), r.out)
      assert.is_true(has(r, "shape {3,2} dtype f32"), r.out)
      assert.is_true(has(r, "max abs diff: 1"), r.out)
    end)
  end)
end)

describe("the command line", function()
  it("names the argument that is wrong, prints the usage and exits 1", function()
    local cases = {
      { "--bogus x.lua", "unrecognised option: %-%-bogus$" },
      { "--timeout 0 x.lua", "%-%-timeout expects a number of seconds > 0: 0$" },
      { "--timeout abc x.lua", "%-%-timeout expects a number of seconds > 0: abc$" },
      { "--timeout nan x.lua", "%-%-timeout expects a number of seconds > 0: nan$" },
      { "--backend '' x.lua", "%-%-backend expects cpu or cuda: \"\"$" },
      { "--device -1 x.lua", "%-%-device expects a device index >= 0: %-1$" },
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
      { "TPSH_TIMEOUT=abc", "TPSH_TIMEOUT expects a number of seconds > 0: abc$" },
      { "TPSH_FINALIZE_TIMEOUT=-1", "TPSH_FINALIZE_TIMEOUT expects a number of seconds > 0: %-1$" },
      { "TPSH_CHECK=bogus", "TPSH_CHECK expects 0, 1 or error: bogus$" },
      { "TPSH_COLL_TIMING=yes", "TPSH_COLL_TIMING expects 0 or 1: yes$" },
      { "TPSH_CPU_COLL_BLOCKING=2", "TPSH_CPU_COLL_BLOCKING expects 0 or 1: 2$" },
    }
    for _, c in ipairs(env_cases) do
      local r = run_tpsh("-e 'print(1)'", nil, c[1])
      assert.are.equal(1, r.code, c[1] .. ": " .. r.out)
      assert.is_truthy(r.lines[1] and r.lines[1]:find(c[2]), c[1] .. ": " .. r.out)
    end
    -- and the values the docs name still run
    for _, env in ipairs { "TPSH_CHECK=error", "TPSH_COLL_TIMING=1", "TPSH_CPU_COLL_BLOCKING=0", "TPSH_CHECK=" } do
      local r = run_tpsh("-e 'print(1)'", nil, env)
      assert.are.equal(0, r.code, env .. ": " .. r.out)
    end
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

  it("writes the --trace file at os.exit(0), and says when an error leaves it unwritten", function()
    -- os.exit(0) skipped the end of the script: no trace, and nothing said
    local path = tp.rank == 0 and (os.tmpname() .. "_exit.json") or nil
    path = tp.bcast(path, 0)
    local np = have_mpiexec and 2 or nil
    local r = run_tpsh("--backend cpu --trace " .. q(path) .. [[ -e 'tp.ones({8}):add_(1); os.exit(0)']], np)
    local text = take_file(path)
    assert.are.equal(0, r.code, r.out)
    assert.is_string(text, "no trace written at os.exit(0): " .. r.out)
    assert.is_truthy(text:find('"name":"add"', 1, true), "the trace lacks the op")
    r = run_tpsh("--backend cpu --trace " .. q(path) .. [[ -e 'error("boom")']], np)
    assert.are.equal(1, r.code, r.out)
    assert.is_true(has(r, "^%[rank 0%] tpsh: %-%-trace .* was not written: the run ended with status 1$"), r.out)
    -- a directory is refused before the run, as a script's name is
    r = run_tpsh("--backend cpu --trace /tmp -e 'print(1)'")
    assert.are.equal(1, r.code, r.out)
    assert.is_truthy(r.lines[1]:find("not a directory: /tmp$"), r.out)
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
  end)

  it("says that a stream's error was found at the end of the script, not in a call it never made", function()
    if not have_mpiexec then return pending("mpiexec not found") end
    -- the ranks disagree on the count: MPI fails the all_reduce inside rank 0's stream, and nothing
    -- in the script waits for it
    local r = run_tpsh([[--backend cpu -e 'tp.world:all_reduce(tp.ones(tp.rank == 0 and 4 or 8))']], 2)
    assert.are_not.equal(0, r.code, r.out)
    assert.is_true(has(r, "at the end of the script, waiting for every stream: on stream 'default': all_reduce"), r.out)
  end)

  it("refuses an unknown backend by name", function()
    local r = run_tpsh([[--backend nope -e 'print(1)']])
    assert.are_not.equal(0, r.code, r.out)
    assert.is_true(has(r, "nope"), r.out)
  end)
end)
