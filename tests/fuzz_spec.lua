-- A short smoke of scripts/ci/fuzz_api.lua, the randomized review of bad input (docs/design.md, "Fuzzing the
-- API"): fixed seeds, so that a run is the same calls every time, in child processes (a crash there is a
-- failure here, not the end of the suite; and the fuzzer's calls leave nothing in this process). The
-- long runs are scripts/ci/fuzz_api.sh's. Rank 0 runs the children and broadcasts the outcome, so the spec
-- runs under any -n. Needs TPSH_EXE (set by tpsh); the multi-rank runs need mpiexec too.
local EXE = os.getenv("TPSH_EXE")

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local child = dofile(here .. "support/child_job.lua")
local shell_quote, have_mpiexec = child.quote, child.have_mpiexec

-- scripts/ci/fuzz_api.lua beside this spec's directory
local SCRIPT = here .. "../scripts/ci/fuzz_api.lua"

-- Runs `[mpiexec -n np] tpsh --backend cpu <opts> fuzz_api.lua <args>` on rank 0 (60 s at most); every
-- rank gets { status =, seconds =, output = }.
local function run_fuzz(np, opts, args)
  local log = tp.rank == 0 and os.tmpname() or nil
  -- The address space is capped (a slip in the fuzzer's size limits must not take the machine's
  -- memory), except under AddressSanitizer, whose shadow memory alone is terabytes of address space:
  -- scripts/ci/sanitize.sh caps allocations by ASAN_OPTIONS' max_allocation_size_mb instead.
  -- OpenBLAS starts a thread per core when it is loaded (before tpsh sets its one thread), each with a
  -- buffer of up to 128 MiB of address space: on a 64-core machine that alone passed the cap, and
  -- MPI_Init failed to create its threads. The fuzzer needs no BLAS threads; it gets one from the start.
  local cap = os.getenv("ASAN_OPTIONS") and "" or "ulimit -v 8000000; "
  local res = child.run(cap .. "OPENBLAS_NUM_THREADS=1 exec " .. (np and ("mpiexec -n " .. np .. " ") or "") .. shell_quote(EXE)
    .. " --backend cpu " .. opts .. " " .. shell_quote(SCRIPT) .. " --quiet --log " .. tostring(log) .. " " .. args
    .. " 2>&1")
  if log then
    os.remove(log)
    if np then for k = 0, np - 1 do os.remove(log .. ".r" .. k) end end
  end
  return res
end

describe("fuzz_api.lua (randomized bad input, a short smoke)", function()
  local no_exe = not EXE
  local no_mpiexec = no_exe or not tp.bcast(tp.rank == 0 and have_mpiexec() or nil, 0)

  it("2000 random single-rank calls of seed 1 end cleanly, every error naming its call", function()
    if no_exe then return pending("needs TPSH_EXE") end
    local r = run_fuzz(nil, "", "--seed 1 --iters 2000")
    assert.are.equal(0, r.status, r.output)
    assert.truthy(r.output:find("fuzz_api: seed 1, rank 0, %d+ single%-rank calls %(%d+ raised%), 0 findings"), r.output)
    assert.is_true(r.seconds < 30, ("took %.1f s"):format(r.seconds))
  end)

  it("random collectives of seed 1 on 2 ranks match, give the right values and end cleanly", function()
    if no_mpiexec then return pending("needs mpiexec and TPSH_EXE") end
    local r = run_fuzz(2, "--timeout 20", "--collectives --seed 1 --iters 60")
    assert.are.equal(0, r.status, r.output)
    assert.truthy(r.output:find("collectives on 2 ranks, %d+ collective steps"), r.output)
    assert.is_falsy(r.output:find("FINDING", 1, true), r.output)
  end)

  it("a collective that differs between the ranks ends every rank with a non-zero status", function()
    if no_mpiexec then return pending("needs mpiexec and TPSH_EXE") end
    -- f32 on one rank, f64 on the other: check mode names both; without it MPI fails the larger message
    for _, o in ipairs { "--check --timeout 20", "--timeout 5" } do
      local r = run_fuzz(2, o, "--collectives --seed 1 --iters 8 --mismatch-kind 3")
      assert.truthy(r.output:find("fuzz_api: mismatch 3 at step", 1, true), r.output)
      assert.is_true(r.status ~= nil and r.status ~= 0 and r.status < 128, ("%s: status %s\n%s"):format(o,
        tostring(r.status), r.output))
      assert.is_true(r.seconds < 20, ("%s: took %.1f s"):format(o, r.seconds))
    end
  end)
end)
