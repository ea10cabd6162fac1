-- stream.lua: streams, events and the current stream.
--
-- Streams and events are C objects with metatypes; the Lua handle holds one reference and ffi.gc drops
-- it. The current stream belongs to this Lua state (API.md: "a current stream per Lua state"); every op
-- is enqueued on it unless told otherwise, exactly as on a CUDA device.
local ffi = require "ffi"
local capi = require "tpsh.capi"
local C, check, checkp, raise = capi.C, capi.check, capi.checkp, capi.raise

local M = {}

local stream_ct = ffi.typeof("tpsh_stream *")
local event_ct = ffi.typeof("tpsh_event *")
M.stream_ct, M.event_ct = stream_ct, event_ct

local function is_stream(v) return ffi.istype(stream_ct, v) end
local function is_event(v) return ffi.istype(event_ct, v) end
M.is_stream, M.is_event = is_stream, is_event

local function want_stream(v, name, what)
  if not is_stream(v) then
    raise(name, ("expected a stream%s, got %s"):format(what or "", capi.describe(v)), 3)
  end
  return v
end
M.want_stream = want_stream

-- Each method's self (a dot call, s.query(), would hand C a NULL).
local function self_stream(s, name) if not is_stream(s) then capi.not_self(name, "stream", "s", s) end end
local function self_event(e, name) if not is_event(e) then capi.not_self(name, "event", "e", e) end end

-- Every Lua handle of a stream, by stream id, while it lives: a Work names its stream by id (work.lua),
-- and w.stream finds the handle here.
local by_id = setmetatable({}, { __mode = "v" })
local function wrap_stream(p)
  local s = ffi.gc(p, C.tpsh_stream_release)
  by_id[tonumber(C.tpsh_stream_id(s))] = s
  return s
end
M.wrap_stream = wrap_stream
function M.by_id(id) return by_id[id] end

-- ==== the current stream ========================================================================
local default, current

function M.default_stream()
  if not default then default = wrap_stream(checkp(C.tpsh_default_stream(), "tp.default_stream")) end
  return default
end

function M.current_stream()
  return current or M.default_stream()
end

-- The stream argument of a call that defaults to the current stream (event:record, event:wait,
-- work:wait): s checked, or the current stream when s is nil.
function M.stream_arg(s, name)
  if s == nil then return M.current_stream() end
  return want_stream(s, name)
end

-- Inside a coroutine, fn runs in a coroutine of its own, so that a yield in it comes back here: the
-- caller's stream is current again while the caller's coroutine is suspended, and s once it is resumed.
-- (pcall lets a yield through, and s would stay current for everything the program runs meanwhile, for
-- good if the coroutine is never resumed.) On the main thread a yield is an error, and pcall alone spares
-- the coroutine's cost.
-- back: the stream current where this coroutine was last entered (with_stream's call, or the resume
-- after a yield), which is where control goes on a yield or the return. It is taken at every resume:
-- the resumer may be elsewhere than the first caller (inside another with_stream, or at top level),
-- and restoring the first caller's stream would leak it to the resumer.
local function with_stream_co(s, back, co, ok, ...)
  current = back
  if not ok then error((...), 0) end
  if coroutine.status(co) == "dead" then return ... end
  local function resumed(...)
    local here = current
    current = s
    return with_stream_co(s, here, co, coroutine.resume(co, ...))
  end
  return resumed(coroutine.yield(...))
end

-- with_stream's way out on the main thread: every result, trailing nils too, as the coroutine path
-- returns them (unpack to table.maxn dropped them)
local function restore(saved, ok, ...)
  current = saved
  if not ok then error((...), 0) end
  return ...
end

-- Set by with_stream only; restored on the way out, also on error (and while fn is suspended).
function M.with_stream(s, fn, ...)
  want_stream(s, "tp.with_stream", " as argument 1")
  if type(fn) ~= "function" then raise("tp.with_stream", "expected a function as argument 2, got " .. type(fn)) end
  local saved = current
  if coroutine.running() then
    local co = coroutine.create(fn)
    current = s
    return with_stream_co(s, saved, co, coroutine.resume(co, ...))
  end
  current = s
  return restore(saved, pcall(fn, ...))
end

-- ==== streams ===================================================================================
local priorities = { high = 1, normal = 0, low = -1 }
local STREAM_OPTIONS, EVENT_OPTIONS = { name = true, priority = true }, { timing = true }

function M.new_stream(opts)
  opts = opts or {}
  if type(opts) ~= "table" then raise("tp.stream", "expected a table of options, got " .. type(opts)) end
  capi.check_options("tp.stream", opts, STREAM_OPTIONS)
  local p = opts.priority or "normal"
  local prio = priorities[p]
  if not prio then
    raise("tp.stream", ("unknown priority %s: expected \"high\", \"normal\" or \"low\""):format(tostring(p)))
  end
  if opts.name ~= nil and type(opts.name) ~= "string" then
    raise("tp.stream", "name must be a string, got " .. type(opts.name))
  end
  -- the C side keeps a C string: "a\0b" became "a" without a word
  if opts.name and opts.name:find("\0", 1, true) then
    raise("tp.stream", "name must not hold a NUL byte, got " .. ("%q"):format(opts.name):gsub("\\\n", "\\n"))
  end
  local p = C.tpsh_stream_create(prio, opts.name)
  if p == nil then
    -- Streams dropped but not yet collected each hold a worker thread (CPU backend) or a device stream,
    -- a cost the garbage collector does not see: collect them and try once more before reporting.
    collectgarbage()
    collectgarbage()
    p = C.tpsh_stream_create(prio, opts.name)
  end
  return wrap_stream(checkp(p, "tp.stream"))
end

local S = {}
local prio_names = { [1] = "high", [0] = "normal", [-1] = "low" }
local stream_props = {
  name = function(s) return ffi.string(C.tpsh_stream_name(s)) end,
  priority = function(s) return prio_names[C.tpsh_stream_priority(s)] end,
  id = function(s) return tonumber(C.tpsh_stream_id(s)) end,
}

function S.synchronize(s)
  self_stream(s, "stream:synchronize")
  check(C.tpsh_stream_synchronize(s), "stream:synchronize")
end
function S.query(s)
  self_stream(s, "stream:query")
  local r = C.tpsh_stream_query(s)
  if r < 0 then check(-r, "stream:query") end
  return r == 1
end
function S.wait_event(s, e)
  self_stream(s, "stream:wait_event")
  if not is_event(e) then raise("stream:wait_event", "expected an event, got " .. capi.describe(e)) end
  check(C.tpsh_stream_wait_event(s, e), "stream:wait_event")
end
-- The native stream (a cudaStream_t as a void * cdata) for code that calls CUDA through the FFI; nil
-- on the CPU backend, whose streams are threads.
function S.handle(s)
  self_stream(s, "stream:handle")
  local h = C.tpsh_stream_handle(s)
  if h ~= nil then return h end
  return nil                    -- one value, nil: print(s:handle()) and tostring(s:handle()) work
end
function S.wait_stream(s, other)
  self_stream(s, "stream:wait_stream")
  want_stream(other, "stream:wait_stream")
  check(C.tpsh_stream_wait_stream(s, other), "stream:wait_stream")
end

ffi.metatype("struct tpsh_stream", {
  __index = capi.indexer(S, stream_props),
  __newindex = capi.no_new_fields("stream"),
  __tostring = function(s)
    return ("stream(%s, priority=%s)"):format(ffi.string(C.tpsh_stream_name(s)),
      prio_names[C.tpsh_stream_priority(s)])
  end,
})
M.stream_methods = S

-- ==== events ====================================================================================
function M.new_event(opts)
  opts = opts or {}
  if type(opts) ~= "table" then raise("tp.event", "expected a table of options, got " .. type(opts)) end
  capi.check_options("tp.event", opts, EVENT_OPTIONS)
  local timing = capi.want_flag("tp.event", opts, "timing")
  return ffi.gc(checkp(C.tpsh_event_create(timing and 1 or 0), "tp.event"), C.tpsh_event_release)
end

local E = {}
function E.record(e, s)
  self_event(e, "event:record")
  s = M.stream_arg(s, "event:record")
  check(C.tpsh_event_record(e, s), "event:record")
  return e
end
function E.wait(e, s)
  self_event(e, "event:wait")
  s = M.stream_arg(s, "event:wait")
  check(C.tpsh_stream_wait_event(s, e), "event:wait")
end
function E.query(e)
  self_event(e, "event:query")
  local r = C.tpsh_event_query(e)
  if r < 0 then check(-r, "event:query") end
  return r == 1
end
function E.synchronize(e)
  self_event(e, "event:synchronize")
  check(C.tpsh_event_synchronize(e), "event:synchronize")
end
local ms = ffi.new("double[1]")
function E.elapsed(e, later)
  self_event(e, "event:elapsed")
  if not is_event(later) then raise("event:elapsed", "expected an event, got " .. capi.describe(later)) end
  check(C.tpsh_event_elapsed(e, later, ms), "event:elapsed")
  return ms[0]
end

ffi.metatype("struct tpsh_event", { __index = E, __newindex = capi.no_new_fields("event"),
  __tostring = function() return "event" end })
M.event_methods = E

function M.synchronize() check(C.tpsh_synchronize(), "tp.synchronize") end

return M
