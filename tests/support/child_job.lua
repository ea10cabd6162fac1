-- child_job.lua: running tpsh (or mpiexec tpsh) as a child process from inside a spec, for the specs
-- that test what a whole job does: watchdog_spec, fuzz_spec and runner_spec. Not a spec itself
-- (discovery takes *_spec.lua); a spec loads it with dofile from its own directory.
local M = {}

-- A child started from inside an mpiexec'd rank must not see its parent's process-manager variables,
-- or MPI_Init in the child would try to join the parent's job. tpsh's os.execute and io.popen leave them
-- out already (tpsh.child_env); CLEAN says so again where a command is built for another shell.
local names = require("tpsh.child_env").launcher_names()
M.CLEAN = #names > 0 and ("unset " .. table.concat(names, " ") .. "; ") or ""

-- s as one word of sh
function M.quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Whether mpiexec is on PATH (asked on the rank that calls it).
function M.have_mpiexec()
  local p = io.popen("command -v mpiexec 2>/dev/null")
  local out = p:read("*a")
  p:close()
  return out ~= ""
end

-- Runs the sh command cmd (CLEAN is put first) on rank 0 under `timeout limit` (seconds, default 60);
-- every rank gets { status =, seconds =, output = }, output being stdout and stderr together and status
-- nil where the shell printed none.
--
-- A child job runs the same whatever the rank count of the suite that starts it, so a suite run with
-- TPSH_SPEC_CHILD_JOBS=0 leaves the tests that start one pending (CMakeLists.txt: specs_np2 runs them,
-- the other rank counts do not run them again).
function M.run(cmd, limit)
  if os.getenv("TPSH_SPEC_CHILD_JOBS") == "0" then
    pending("its child job runs in the suite's run without TPSH_SPEC_CHILD_JOBS=0")
  end
  local res
  if tp.rank == 0 then
    local t0 = tp.now()
    local p = io.popen("sh -c " .. M.quote("timeout " .. (limit or 60) .. " sh -c " .. M.quote(M.CLEAN .. cmd)
      .. "; echo EXIT=$?"))
    local out = p:read("*a")
    p:close()
    res = { seconds = (tp.now() - t0) / 1e3, output = out, status = tonumber(out:match("EXIT=(%d+)%s*$")) }
  end
  return tp.bcast(res, 0)
end

return M
