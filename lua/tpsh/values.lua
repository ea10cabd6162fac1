-- values.lua: Lua values across ranks (host side, not tensors): tp.allgather, tp.gather, tp.bcast,
-- tp.barrier. Values are serialised with LuaJIT's string.buffer (numbers, strings, booleans, nil and
-- tables of those, nested) and moved as bytes by MPI on the group's host communicator.
local ffi = require "ffi"
local buffer = require "string.buffer"
local capi = require "tpsh.capi"
local C, check, raise = capi.C, capi.check, capi.raise

local M = {}

local outp = ffi.new("void *[1]")
local outlen = ffi.new("int64_t[1]")
local lens_cache = {}

local function lens_for(n)
  local l = lens_cache[n]
  if not l then l = ffi.new("int64_t[?]", n); lens_cache[n] = l end
  return l
end

-- The bytes of v, or nil and why not.
local function try_encode(v)
  local ok, s = pcall(buffer.encode, v)
  if not ok then return nil, "cannot send this value: " .. tostring(s):gsub("^.-: ", "") end
  return s
end
-- Never compiled: where a trace holds this pcall, the encoder's error for a value it cannot serialise
-- (a tensor in the table) comes back through the compiled code of the LuaJIT we build on (2.1 of
-- 2022-03) into the slot of the caller's `name`, and the call raises "cannot serialize 'cdata': cannot
-- send ..." without naming itself (docs/design.md, "Errors"). Values sent between ranks are host-side
-- exchanges, where a compiled encode saves nothing.
jit.off(try_encode)

local function decode_list(p, lens, n)
  local out, at = {}, 0
  local base = ffi.cast("const char *", p)
  for r = 0, n - 1 do
    local len = tonumber(lens[r])
    out[r + 1] = buffer.decode(ffi.string(base + at, len))
    at = at + len
  end
  return out
end

-- g: a tpsh_group * (default: the world)
local world
local function group_ptr(g)
  if g ~= nil then return g end
  if not world then world = ffi.gc(C.tpsh_world(), C.tpsh_group_release) end
  return world
end
M.group_ptr = group_ptr

-- This rank's part of exchange fn(g, bytes, length, ...) (tpsh_host_allgather, _gather, _bcast). A rank
-- with nothing it can send (why: a value that cannot be serialised, or no valid root) still takes part,
-- with length -1, so that the exchange fails on every rank (the others name it), and then raises why:
-- raising before the exchange left the other ranks waiting in it until the watchdog's timeout.
local function exchange(name, why, fn, g, s, ...)
  if why then
    capi.unless_ended(fn(g, nil, -1, ...))   -- its failure is the others' to report
    raise(name, why)
  end
  check(fn(g, s, #s, ...), name)
end

-- name: the call to blame in errors (tp.allgather, or group:allgather when g:allgather called it).
-- wait: where a call of the library exchanges values (group:split's check, tp.time's plan,
-- tp.trace.summary), what the watchdog names when a rank never comes: the call the script made, not the
-- tp.allgather inside it (a nested wait keeps the outer one's name). A constant: the watchdog may read it
-- after the call.
function M.allgather(v, g, name, wait)
  name = name or "tp.allgather"
  g = group_ptr(g)
  local s, why = try_encode(v)
  local n = C.tpsh_group_size(g)
  local lens = lens_for(n)
  if wait then
    C.tpsh_watch_wait_begin(wait)
    local ok, err = pcall(exchange, name, why, C.tpsh_host_allgather, g, s, outp, lens)
    C.tpsh_watch_wait_end()
    if not ok then error(err, 0) end
  else
    exchange(name, why, C.tpsh_host_allgather, g, s, outp, lens)
  end
  local res = decode_list(outp[0], lens, n)
  C.tpsh_free_buffer(outp[0])
  return res
end

-- root, or -1 and why not (a rank with no valid root takes part in the agreement on the root, group.c's
-- agree_root, with -1).
local function want_root(root, g)
  root = root or 0
  local n = C.tpsh_group_size(g)
  if type(root) ~= "number" or root < 0 or root >= n or root ~= math.floor(root) then
    return -1, ("root must be a rank in [0, %d), got %s"):format(n, capi.show(root))
  end
  return root
end

function M.gather(v, root, g, name)
  name = name or "tp.gather"
  g = group_ptr(g)
  local why
  root, why = want_root(root, g)
  local s = ""
  if not why then s, why = try_encode(v) end
  local n = C.tpsh_group_size(g)
  local lens = lens_for(n)
  exchange(name, why, C.tpsh_host_gather, g, s, root, outp, lens)
  if C.tpsh_group_rank(g) ~= root then return nil end
  local res = decode_list(outp[0], lens, n)
  C.tpsh_free_buffer(outp[0])
  return res
end

function M.bcast(v, root, g, name)
  name = name or "tp.bcast"
  g = group_ptr(g)
  local why
  root, why = want_root(root, g)
  local s = ""
  if not why and C.tpsh_group_rank(g) == root then s, why = try_encode(v) end   -- only the root sends
  exchange(name, why, C.tpsh_host_bcast, g, s, root, outp, outlen)
  local res = buffer.decode(ffi.string(outp[0], outlen[0]))
  C.tpsh_free_buffer(outp[0])
  return res
end

function M.barrier(g, name)
  check(C.tpsh_host_barrier(group_ptr(g), name), name or "tp.barrier")
end

return M
