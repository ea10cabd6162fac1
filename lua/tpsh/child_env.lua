-- tpsh.child_env: commands that a rank starts (os.execute, io.popen) run without the launcher's
-- variables.
--
-- A rank started by mpiexec (or srun) holds the process manager's connection in its environment
-- (PMI_FD, PMI_RANK, Hydra's HYDI_ variables, Open MPI's OMPI_ and PMIX_ ones). A child MPI
-- program that inherits them joins the parent's job in MPI_Init instead of starting its own: a child
-- tpsh under `mpiexec -n 2 tpsh test` ended the whole job with status 13 after a clean summary. The
-- variables are unset in the child's shell only; the rank's own environment keeps them (its MPI library
-- may read them again at finalize).
local ffi = require "ffi"

local M = {}

-- The launcher's variables: its connection and this rank's place in the job (MPICH/Hydra, Slurm's
-- PMI, PMIx, Open MPI's runtime). What a person sets to configure the MPI library is kept: MPICH's
-- MPIR_CVAR_*, Open MPI's OMPI_MCA_* parameters (but the runtime's own orte_, ess, pmix and
-- initial_wdir ones) and OMPI_ALLOW_RUN_AS_ROOT*.
local function launchers(name)
  if name:find("^PMIX?_") or name:find("^HYD[IR]A?_") or name:find("^MPI_LOCAL") or name:find("^PRTE_") then
    return true
  end
  if name:find("^OMPI_") then
    if name:find("^OMPI_ALLOW_RUN_AS_ROOT") then return false end
    local mca = name:match("^OMPI_MCA_(.*)$")
    if not mca then return true end
    return mca:find("^orte_") or mca:find("^ess") or mca:find("^pmix") or mca == "initial_wdir"
      or mca:find("^shmem_RUNTIME_QUERY") or false
  end
  return false
end
M.is_launchers = launchers

pcall(ffi.cdef, "extern char **environ;")

-- The names of this process's variables that a child must not see.
function M.launcher_names()
  local names = {}
  local ok, env = pcall(function() return ffi.C.environ end)
  if not ok or env == nil then return names end
  local i = 0
  while env[i] ~= nil do
    local name = ffi.string(env[i]):match("^([%w_]+)=")
    if name and launchers(name) then names[#names + 1] = name end
    i = i + 1
  end
  table.sort(names)
  return names
end

-- Wraps os.execute and io.popen so that their commands start with the names unset; returns the
-- function that puts the originals back. With no such variable (no launcher) nothing is wrapped.
function M.install()
  local names = M.launcher_names()
  if #names == 0 then return function() end end
  local prefix = "unset " .. table.concat(names, " ") .. "; "
  local execute, popen = os.execute, io.popen
  os.execute = function(cmd, ...)
    if type(cmd) ~= "string" then return execute(cmd, ...) end   -- os.execute(): is there a shell?
    return execute(prefix .. cmd, ...)
  end
  io.popen = function(cmd, ...)
    if type(cmd) ~= "string" then return popen(cmd, ...) end
    return popen(prefix .. cmd, ...)
  end
  return function() os.execute, io.popen = execute, popen end
end

return M
