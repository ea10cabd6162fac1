-- tpsh: the module `tp` (a global in scripts, the REPL and specs; also require "tpsh").
--
-- This file only assembles the API of docs/api.md from the modules that implement it; each concern
-- lives in its own file (tensor.lua, stream.lua, values.lua, ...).
local ffi = require "ffi"
local capi = require "tpsh.capi"
local tensor = require "tpsh.tensor"
local stream = require "tpsh.stream"
local values = require "tpsh.values"
local C, unless_ended = capi.C, capi.unless_ended

local tp = {}

-- What this process is: read-only. The fields live in the metatable's __index table, so that an
-- assignment reaches __newindex and is refused: a script that set tp.rank (say, to fake a rank while
-- testing) would have filled and checked its tensors with a rank the runtime does not use, and its
-- collectives would not have matched. Anything else may be set on tp, as on any table.
local identity = {
  rank = C.tpsh_rank(),
  size = C.tpsh_size(),
  local_rank = C.tpsh_local_rank(),
  backend = ffi.string(C.tpsh_backend_name()),
  device = C.tpsh_device(),
  version = (ffi.string(C.tpsh_versions()):match("^tpsh (%S+)")),
}
setmetatable(tp, {
  __index = identity,
  __newindex = function(t, k, v)
    if identity[k] ~= nil then
      capi.raise("tp", ("cannot set %s: tp.%s is read-only (it is what the collectives and the runtime use)")
        :format(capi.show(k), k))
    end
    rawset(t, k, v)
  end,
})
tp.config = {}

tensor._init_seed(tp.rank)

-- tensors
for _, name in ipairs { "empty", "zeros", "ones", "full", "arange", "rand", "randn", "from", "empty_like",
  "zeros_like", "cat", "matmul", "spin", "allclose", "equal", "manual_seed", "is_tensor" } do
  tp[name] = tensor[name]
end
-- reductions along a dim, softmax, norms, addmm and bmm (their methods too)
require("tpsh.ops_reduce").install(tp)
for _, name in ipairs(require("tpsh.ops_pointwise").names) do tp[name] = tensor[name] end

-- streams and events
tp.stream = stream.new_stream
tp.event = stream.new_event
tp.current_stream = stream.current_stream
tp.default_stream = stream.default_stream
tp.with_stream = stream.with_stream
tp.synchronize = stream.synchronize
tp.is_stream = stream.is_stream

-- Lua values across ranks
tp.allgather = function(v) return values.allgather(v) end
tp.gather = function(v, root) return values.gather(v, root) end
tp.bcast = function(v, root) return values.bcast(v, root) end
tp.barrier = function() return values.barrier() end

-- host clock (ms), for measuring what the host sees
tp.now = function() return C.tpsh_now_ms() end

-- What the parts below run when the host hands over the command line (--trace, --check, --timeout),
-- and at exit (writing the trace).
local configure_hooks, finish_hooks = {}, {}
function tp._on_configure(fn) configure_hooks[#configure_hooks + 1] = fn end
function tp._on_finish(fn) finish_hooks[#finish_hooks + 1] = fn end

-- Groups and collectives, memory, tp.time / tp.compare, the trace, check mode, ranges, chaos mode and
-- graphs each add their part of tp.
for _, mod in ipairs { "tpsh.group", "tpsh.memory", "tpsh.measure", "tpsh.trace", "tpsh.check", "tpsh.range",
  "tpsh.chaos", "tpsh.graph" } do
  require(mod).install(tp)
end

-- Commands that a rank starts (os.execute, io.popen) run without the launcher's variables: a child MPI
-- program (a tpsh) that sees them joins this job in MPI_Init and hangs it (tpsh.child_env).
require("tpsh.child_env").install()

-- Called by the host with the command-line configuration.
function tp._configure(cfg)
  for k, v in pairs(cfg) do tp.config[k] = v end
  for _, fn in ipairs(configure_hooks) do fn(tp.config) end
end

-- Called by the host after the script: waits for all streams (so errors inside them surface) and runs
-- what wants to run at exit (writing the trace). Returns this rank's exit status: 0, or the largest
-- that a hook returned (check mode's 66 when reports were left); or, where the end itself found the
-- run wrong (sends without receives, an error inside a stream, a rank that never came), the message,
-- which the host prints without a traceback: it would point here, not into the script.
function tp._finish()
  -- Sends and receives first, pair by pair, before waiting for the streams: an unmatched receive
  -- would keep the wait from ending (p2p_ledger.c).
  -- (Each status goes through capi.unless_ended, as check's do: where the run is being ended, this
  -- rank's --trace records are written instead.)
  if unless_ended(C.tpsh_watch_p2p_at_end()) ~= 0 then return "at the end of the script: " .. capi.last_error() end
  -- An error inside a stream surfaces here: say it was found at the end, not in a call the script
  -- never made.
  if unless_ended(C.tpsh_synchronize()) ~= 0 then
    return "at the end of the script, waiting for every stream: " .. capi.last_error()
  end
  -- Every rank waits here for the others (the watchdog's end of a script; before the hooks, whose
  -- trace gathering is an exchange of its own).
  if unless_ended(C.tpsh_watch_end_of_script()) ~= 0 then return "at the end of the script: " .. capi.last_error() end
  local code = 0
  for _, fn in ipairs(finish_hooks) do
    local r = fn()
    if type(r) == "number" and r > code then code = r end
  end
  return code
end

package.loaded.tpsh = tp
return tp
