-- capi.lua: the C ABI as seen from Lua, and the one way errors cross from C to Lua.
--
-- The declarations come from src/tpsh.h itself (the build extracts them into the module tpsh.cdef),
-- so they can never drift from the C side. C functions return a status and leave a message in
-- tpsh_last_error(); `check` turns that into a Lua error that names the Lua call, pointed at the
-- caller's line.
local ffi = require "ffi"

ffi.cdef(require "tpsh.cdef")
local C = ffi.C

local M = { C = C }

-- The message of the C call that failed, read to be raised: an asynchronous error that it carries has
-- then been told to the script, which tpsh_async_error_raised records (until then every wait returns
-- it: src/core/error.c).
local function last_error()
  C.tpsh_async_error_raised()
  return ffi.string(C.tpsh_last_error())
end
M.last_error = last_error

-- The error level of the user's code: the first frame above this one that is not tpsh's own Lua
-- (modules compiled into the binary carry their source path, which contains "/lua/tpsh/"). Computed
-- on the error path only, so that every public function reports at its caller's line however deeply
-- it is nested inside tpsh.
local function user_level()
  local level = 3
  while true do
    local info = debug.getinfo(level, "S")
    if not info then return 0 end   -- no user frame (the REPL showing a value, an exit hook): no position, not capi.lua's
    if not info.source:find("/lua/tpsh/", 1, true) and info.what ~= "C" then return level - 1 end
    level = level + 1
  end
end
M.user_level = user_level

-- Raises "name: message" at the user's call site.
function M.raise(name, msg)
  error(name .. ": " .. msg, user_level())
end

-- A thread that ends the run (the watchdog, a signal) asked this host thread, which alone runs Lua, for
-- its --trace records (src/core/host_ending.c): a host wait gave way with TPSH_EENDED. Writes them as a
-- failed run does (tp.trace._own_line), hands the line to C, which says it, and never returns: that
-- thread ends the process. No error is raised, which a pcall of the script or the test runner would take.
local function give_way()
  if C.tpsh_host_ending_begin() ~= 0 then
    local trace = package.loaded["tpsh.trace"]
    local ok, line = pcall(trace and trace._own_line or error, C.tpsh_host_ending_status(),
      ffi.string(C.tpsh_host_ending_message()))
    C.tpsh_host_ending_done(ok and line or "tpsh: --trace was not written: " .. tostring(line))
  end
  C.tpsh_host_ending_hold()
end

-- A C call's status, after a TPSH_EENDED has gone to give_way (which does not return): for the few
-- callers that read a status themselves instead of raising it through check.
function M.unless_ended(rc)
  if rc == C.TPSH_EENDED then give_way() end
  return rc
end

-- check(status, name): raise when a C call failed. A call that a graph's capture cannot hold
-- (TPSH_ECAPTURE: C says what it does) is worded as tp.graph's error naming the call, at the call's line:
-- "tp.graph: tensor:item() reads to the host during capture: ...".
function M.check(rc, name)
  if rc ~= 0 then
    M.unless_ended(rc)
    if rc == C.TPSH_ECAPTURE then error("tp.graph: " .. name .. "() " .. last_error(), user_level()) end
    error(name .. ": " .. last_error(), user_level())
  end
end

-- For C calls that return a pointer (NULL on failure).
function M.checkp(p, name)
  if p == nil then error(name .. ": " .. last_error(), user_level()) end
  return p
end

-- The __index of a cdata metatype: a method of `methods`, else a property computed by `props[k](obj)`.
function M.indexer(methods, props, on_number)
  return function(obj, k)
    local m = methods[k]
    if m ~= nil then return m end
    local p = props[k]
    if p then return p(obj) end
    if on_number and type(k) == "number" then on_number(k) end
  end
end

-- The error of a method called with a dot (x.f() for x:f()), or on something else: name is the
-- method's "kind:f", short the receiver's usual name in examples (t, s, g, w).
function M.not_self(name, kind, short, v)
  M.raise(name, ("expected %s %s as self (call it with a colon: %s:%s(...)), got %s"):format(
    kind:match("^[aeiou]") and "an" or "a", kind, short, name:match("[^:]+$"), M.describe(v)))
end

-- Raises when the options table opts has a key that allowed (a set) lacks: a misspelt option would
-- otherwise be ignored without a word. For calls outside hot loops (groups' collectives have their own).
function M.check_options(name, opts, allowed)
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for a in pairs(allowed) do if not a:find("^_") then names[#names + 1] = a end end
      table.sort(names)
      M.raise(name, ("unknown option %s (expected %s)"):format(M.show(k), table.concat(names, ", ")))
    end
  end
end

-- opts[key] as a flag: nil (not given) or a boolean. Any other value is refused rather than read as
-- truthy, so that {sync = "no"} or {async = 0} does not quietly mean the opposite of what it says.
-- Asked with type(), not `v ~= nil`: a NULL pointer cdata equals nil in LuaJIT, and is truthy.
function M.want_flag(name, opts, key)
  local v = opts[key]
  local ty = type(v)
  if ty ~= "nil" and ty ~= "boolean" then
    M.raise(name, ("opts.%s must be true or false, got %s"):format(key, M.show(v)))
  end
  return v
end

-- A value as the user wrote it, for "got X" in messages: numbers in full (%.17g drops nothing, so 1e30
-- does not turn into an int64's limit), strings quoted, anything else as describe says.
function M.show(v)
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
    return ("%.17g"):format(v)
  end
  if type(v) == "string" then return ("%q"):format(v) end
  return M.describe(v)
end

-- The __newindex of a cdata metatype: t.foo = 1 on a tensor, stream, event or Work is a mistake (a
-- misspelt method, or state meant for a Lua table); the FFI's own message names the C struct.
function M.no_new_fields(kind)
  return function(_, k)
    M.raise(kind, ("cannot set %s: a %s has no fields to set (keep your own values in a Lua table)"):format(
      M.show(k), kind))
  end
end

-- Why a file written at the end of a run could not be (io.open's message: no such folder, a directory,
-- no permission), or nil: --trace and `tpsh test --junit` ask at the start, not after the work. A file
-- the probe makes is removed again.
-- nil when path can be written (core/file_write.c), else why not (the message names the file).
function M.unwritable(path)
  if C.tpsh_check_writable(path) ~= 0 then return ffi.string(C.tpsh_last_error()) end
  return nil
end

-- Writes text to path whole, or returns why not (the path and the system's message). Written to a
-- temporary beside it and renamed (core/file_write.c says why): a failed write (a full disk) leaves the
-- old file, and a link at the name is replaced, not written through. tp.trace.save/svg and `tpsh test
-- --junit` write with it.
function M.write_whole(path, text)
  if C.tpsh_write_whole(path, text, #text) ~= 0 then return ffi.string(C.tpsh_last_error()) end
  return nil
end

-- A short description of a Lua value for "expected X, got Y" messages.
function M.describe(v)
  local t = type(v)
  if t == "cdata" then return tostring(ffi.typeof(v)):match("^ctype<(.*)>$") or "cdata" end
  if t == "table" and getmetatable(v) and getmetatable(v).__name then return getmetatable(v).__name end
  return t
end

return M
