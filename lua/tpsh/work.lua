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
-- The tensors stay referenced until the Work is waited on or seen completed, so that a caller who
-- drops them right after an async call cannot have their memory reused under the collective. (The
-- stream-ordered free would also order the reuse; holding them makes the contract explicit.)
--
-- Two kinds, one interface:
--   a ticket Work (the default) is a small cdata: a ticket for an end event of src/core/work.c's table,
--     which C reuses once it has completed (a stale ticket means completed, and the C functions behind
--     wait/block/query know that), the stream's id and the name's index. The ticket's slot holds the
--     tensors' storages. Nothing in it is for the garbage collector to follow, and that is the point:
--     a Lua table holding its stream and tensors would be a tenth of a 1 KiB collective's time on the
--     GPU machine (tpsh 1.15-1.20x NCCL from C in the same process, 1.06-1.12x with no Work object at
--     all; docs/perf.md), the garbage collector's share of every call.
--   a table Work owns its events (timed Works, check mode) and holds its tensors in _k1, _k2.
local ffi = require "ffi"
local capi = require "tpsh.capi"
local stream = require "tpsh.stream"
local C, check, raise = capi.C, capi.check, capi.raise

local M = {}

-- ==== the two kinds ================================================================================
local W = {}             -- table Works
local mt = { __index = W, __name = "work" }
mt.__tostring = function(w)
  return ("work(%s on stream %s%s)"):format(w.name, w.stream.name, w._k1 ~= nil and "" or ", released")
end

ffi.cdef [[
  typedef struct tpsh_work_ref { double _ticket; uint64_t _stream; int32_t _name; } tpsh_work_ref;
]]
local ticket_ct = ffi.typeof("tpsh_work_ref")
local names, name_index = {}, {}          -- the names Works were given (a handful), by index
local TW = {}            -- ticket Works
local ticket_props = {
  name = function(w) return names[w._name] end,
  stream = function(w) return stream.by_id(tonumber(w._stream)) end,  -- nil once its handle was collected
}
ffi.metatype(ticket_ct, {
  __index = capi.indexer(TW, ticket_props),
  __newindex = capi.no_new_fields("work"),
  __tostring = function(w)
    local s = ticket_props.stream(w)
    return ("work(%s on stream %s)"):format(names[w._name], s and s.name or "(collected)")
  end,
})

-- A table Work. end_: its end event; start_event: a timing event or nil; k1, k2: what it keeps alive
-- (a tensor, a list of tensors, or nil) until it is waited on or seen completed.
function M.new(name, s, end_, start_event, k1, k2)
  return setmetatable({ name = name, stream = s, _start = start_event, _end = end_, _k1 = k1, _k2 = k2 }, mt)
end

-- A ticket Work (tpsh_batch_end_work's ticket) for a collective issued on stream s.
function M.ticket(name, s, ticket)
  local i = name_index[name]
  if not i then
    i = #names + 1
    names[i], name_index[name] = name, i
  end
  return ticket_ct(ticket, C.tpsh_stream_id(s), i)
end

local function release(w) w._k1, w._k2 = nil, nil end

function M.is_work(v) return getmetatable(v) == mt or ffi.istype(ticket_ct, v) end

local function want_work(w, name)
  if getmetatable(w) ~= mt then capi.not_self(name, "work", "w", w) end
end
local function want_ticket(w, name)
  if not ffi.istype(ticket_ct, w) then want_work(w, name) end
end

-- w:elapsed()'s two refusals, for both kinds
local function not_completed(name)
  raise("work:elapsed", "the " .. name .. " has not completed yet (call w:block() first)")
end
local function untimed(name)
  raise("work:elapsed", "the " .. name .. " was issued without timing: pass {timing = true} to it, "
    .. "or set TPSH_COLL_TIMING=1")
end

-- ==== table Works: their own events ================================================================
local ms = ffi.new("double[1]")

function W.wait(w, s)
  want_work(w, "work:wait")
  s = stream.stream_arg(s, "work:wait")
  local rc = C.tpsh_stream_wait_event(s, w._end)
  if rc ~= 0 then check(rc, "work:wait") end
  release(w)
  return w
end

function W.block(w)
  want_work(w, "work:block")
  local rc = C.tpsh_event_synchronize(w._end)
  if rc ~= 0 then check(rc, "work:block") end
  release(w)
  return w
end

function W.is_completed(w)
  want_work(w, "work:is_completed")
  local r = C.tpsh_event_query(w._end)
  if r < 0 then check(-r, "work:is_completed") end
  if r == 1 then release(w) end
  return r == 1
end

function W.elapsed(w)
  want_work(w, "work:elapsed")
  -- untimed first: "call w:block() first" sent the caller to wait for a figure that never comes
  if not w._start then untimed(w.name) end
  local r = C.tpsh_event_query(w._end)
  if r < 0 then check(-r, "work:elapsed") end   -- a failure (an aborted communicator's) is no "not yet"
  if r ~= 1 then not_completed(w.name) end
  release(w)
  check(C.tpsh_event_elapsed(w._start, w._end, ms), "work:elapsed")
  return ms[0]
end

-- ==== ticket Works: work.c does the rest (a stale ticket is a completed Work) ======================
function TW.wait(w, s)
  want_ticket(w, "work:wait")
  s = stream.stream_arg(s, "work:wait")
  local rc = C.tpsh_work_wait(w._ticket, s)
  if rc ~= 0 then check(rc, "work:wait") end
  return w
end

function TW.block(w)
  want_ticket(w, "work:block")
  local rc = C.tpsh_work_block(w._ticket)
  if rc ~= 0 then check(rc, "work:block") end
  return w
end

-- Whether ticket Work w has completed, for the call `name`.
local function ticket_done(w, name)
  want_ticket(w, name)
  local r = C.tpsh_work_query(w._ticket)
  if r < 0 then check(-r, name) end
  return r == 1
end

function TW.is_completed(w) return ticket_done(w, "work:is_completed") end

-- A ticket Work is never timed (timed Works are table Works): said at once, completed or not, rather
-- than "call w:block() first", after which the call would only have said this.
function TW.elapsed(w)
  want_ticket(w, "work:elapsed")
  untimed(names[w._name])
end

return M
