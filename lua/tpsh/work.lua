-- work.lua: the Work a collective returns (API.md "Groups and collectives").
--
-- A Work is the event recorded after the collective on the stream it runs on (and one before it, when
-- the call asked for timing), plus the tensors it uses. Everything a user asks of it is an event
-- operation, exactly as with torch.distributed on CUDA:
--   w:wait([s])       stream s (default: the current one) waits for the end event; the host does not
--   w:block()         the host waits for the end event (and sees the stream's errors)
--   w:is_completed()  queries the end event
--   w:elapsed()       start:elapsed(end) in ms, once completed; needs {timing = true} on the call (or
--                     TPSH_COLL_TIMING=1), as PyTorch needs TORCH_NCCL_ENABLE_TIMING: a timing event
--                     costs host time that small collectives cannot hide
-- The end event is either an event the Work owns (timed Works, check mode) or, by default, a ticket
-- (a number) for an event of src/core/work.c's table, which C reuses once it has completed: a stale
-- ticket means completed, and the C functions behind wait/block/query know that.
-- The tensors stay referenced until the Work is waited on or seen completed, so that a caller who
-- drops them right after an async call cannot have their memory reused under the collective. (The
-- stream-ordered free would also order the reuse; holding them makes the contract explicit.)
local capi = require "tpsh.capi"
local stream = require "tpsh.stream"
local C, check, raise = capi.C, capi.check, capi.raise

local M = {}
local W = {}
local mt = { __index = W, __name = "work" }
mt.__tostring = function(w)
  return ("work(%s on stream %s%s)"):format(w.name, w.stream.name, w._k1 ~= nil and "" or ", released")
end

-- end_: a ticket (number) or an owned event; start_event: an owned timing event or nil; k1, k2: what
-- the Work keeps alive (a tensor, a list of tensors, or nil) until it is waited on or seen completed.
function M.new(name, s, end_, start_event, k1, k2)
  if type(end_) == "number" then
    return setmetatable({ name = name, stream = s, _ticket = end_, _k1 = k1, _k2 = k2 }, mt)
  end
  return setmetatable({ name = name, stream = s, _start = start_event, _end = end_, _k1 = k1, _k2 = k2 }, mt)
end

local function release(w) w._k1, w._k2 = nil, nil end

function M.is_work(v) return getmetatable(v) == mt end

local function want_work(w, name)
  if getmetatable(w) ~= mt then
    raise(name, "expected a work as self (call it with a colon: w:" .. name:match("[^:]+$") .. "()), got "
      .. capi.describe(w))
  end
end

-- 1: completed, 0: pending, < 0: minus an error status.
local function query(w)
  if w._end then return C.tpsh_event_query(w._end) end
  return C.tpsh_work_query(w._ticket)
end

function W.wait(w, s)
  want_work(w, "work:wait")
  if s ~= nil then stream.want_stream(s, "work:wait") else s = stream.current_stream() end
  local rc
  if w._end then rc = C.tpsh_stream_wait_event(s, w._end) else rc = C.tpsh_work_wait(w._ticket, s) end
  if rc ~= 0 then check(rc, "work:wait") end
  release(w)
  return w
end

function W.block(w)
  want_work(w, "work:block")
  local rc
  if w._end then rc = C.tpsh_event_synchronize(w._end) else rc = C.tpsh_work_block(w._ticket) end
  if rc ~= 0 then check(rc, "work:block") end
  release(w)
  return w
end

function W.is_completed(w)
  want_work(w, "work:is_completed")
  local r = query(w)
  if r < 0 then check(-r, "work:is_completed") end
  if r == 1 then release(w) end
  return r == 1
end

local ms = require("ffi").new("double[1]")
function W.elapsed(w)
  want_work(w, "work:elapsed")
  if query(w) ~= 1 then
    raise("work:elapsed", "the " .. w.name .. " has not completed yet (call w:block() first)")
  end
  if not w._start then
    raise("work:elapsed", "the " .. w.name .. " was issued without timing: pass {timing = true} to it, "
      .. "or set TPSH_COLL_TIMING=1")
  end
  release(w)
  check(C.tpsh_event_elapsed(w._start, w._end, ms), "work:elapsed")
  return ms[0]
end

return M
