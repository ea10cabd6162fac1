-- graph.lua: tp.graph, a function's device work captured once and replayed (API.md "Graphs").
--
--   local g = tp.graph(function() y:copy_(x); y:mul_(2); return y end)
--   g:replay()                -- runs it again on the current stream (g() does the same); returns y
--
-- fn runs once, with its ops, collectives, event records and waits recorded rather than run (on CUDA
-- captured into a CUDA graph): on the current stream, and on each stream that waits for it inside fn.
-- What fn returns is kept, and every replay returns it again: tensors made inside fn are static, their
-- memory the graph's (src/core/graph.c says how, on both backends). A graph is a Lua table around a
-- `tpsh_graph *` released by ffi.gc, or at once by g:free().
local ffi = require "ffi"
local capi = require "tpsh.capi"
local stream = require "tpsh.stream"
local C, check, raise = capi.C, capi.check, capi.raise

-- The core's capture flag, read without a call: group.lua gives a collective's Work events of its own
-- during a capture (a Work ticket's event would be queried later, and a captured event cannot be).
ffi.cdef "extern int tpsh_graph_capturing;"

local M = {}
local G = {}
local graph_mt = { __name = "graph" }
local props = {
  name = function(g) return ffi.string(C.tpsh_graph_name(g._p)) end,
}
local info = ffi.new("tpsh_graph_info")
local INFO_FIELDS = { "kernels", "collectives", "records", "waits", "streams", "tensors", "pool_bytes", "replays" }

graph_mt.__index = function(g, k)
  local m = G[k]
  if m ~= nil then return m end
  local p = props[k]
  if p and rawget(g, "_p") then return p(g) end
end
graph_mt.__newindex = capi.no_new_fields("graph")
graph_mt.__tostring = function(g)
  if not g._p then return "graph(freed)" end
  local s = g:stats()
  return ("graph(%s: %d ops, %d collectives on %d stream%s, %d replays%s)"):format(g.name, s.kernels, s.collectives,
    s.streams, s.streams == 1 and "" or "s", s.replays, s.native and ", a CUDA graph" or "")
end

local function is_graph(v) return getmetatable(v) == graph_mt end
M.is_graph = is_graph

local function want_graph(g, name)
  if not is_graph(g) then capi.not_self(name, "graph", "g", g) end
  local p = rawget(g, "_p")
  if not p then raise(name, "the graph was freed (g:free())") end
  return p
end

local GRAPH_OPTIONS = { name = true }

-- fn's results, count included (trailing nils), or the error.
local function results(ok, ...) return ok, select("#", ...), { ... } end

function M.graph(fn, opts)
  if type(fn) ~= "function" then raise("tp.graph", "expected a function, got " .. capi.describe(fn)) end
  opts = opts or {}
  if type(opts) ~= "table" then raise("tp.graph", "expected a table of options, got " .. capi.describe(opts)) end
  capi.check_options("tp.graph", opts, GRAPH_OPTIONS)
  if opts.name ~= nil and (type(opts.name) ~= "string" or opts.name:find("\0", 1, true)) then
    raise("tp.graph", "opts.name must be a string without NUL bytes, got " .. capi.show(opts.name))
  end
  check(C.tpsh_graph_begin(stream.current_stream(), opts.name), "tp.graph")
  -- Inside a coroutine fn runs in a coroutine of its own (as g:batch's function does): a yield would
  -- leave the capture open for whatever the program ran next, so it is refused instead.
  local ok, n, out
  if coroutine.running() then
    local co = coroutine.create(fn)
    ok, n, out = results(coroutine.resume(co))
    if ok and coroutine.status(co) ~= "dead" then
      C.tpsh_graph_abort()
      raise("tp.graph", "the function yielded (coroutine.yield inside tp.graph): the capture ends when it "
        .. "returns, so it must return without yielding; nothing was kept")
    end
  else
    ok, n, out = results(pcall(fn))
  end
  if not ok then
    C.tpsh_graph_abort()
    error(out[1], 0)
  end
  local p = C.tpsh_graph_end()
  if p == nil then raise("tp.graph", capi.last_error()) end
  return setmetatable({ _p = ffi.gc(p, C.tpsh_graph_release), _out = out, _n = n }, graph_mt)
end

-- Runs the graph again after the work enqueued on s (default: the current stream); returns what the
-- function returned at the capture.
function G.replay(g, s)
  local p = want_graph(g, "graph:replay")
  s = stream.stream_arg(s, "graph:replay")
  local rc = C.tpsh_graph_replay(p, s)
  if rc ~= 0 then check(rc, "graph:replay") end
  return unpack(g._out, 1, g._n)
end
graph_mt.__call = G.replay

-- Lets go of the graph's tensors and memory now (in stream order, after its replays).
function G.free(g)
  local p = want_graph(g, "graph:free")
  rawset(g, "_p", nil)
  rawset(g, "_out", {})
  rawset(g, "_n", 0)
  C.tpsh_graph_release(ffi.gc(p, nil))
end

-- { kernels, collectives, records, waits, streams, tensors (held), pool_bytes, replays, native }
function G.stats(g)
  local p = want_graph(g, "graph:stats")
  C.tpsh_graph_get_info(p, info)
  local r = {}
  for _, k in ipairs(INFO_FIELDS) do r[k] = tonumber(info[k]) end
  r.native = info.native ~= 0
  return r
end

-- For calls that take a function and a graph alike (tp.time, tp.compare): a graph as a function that
-- replays it; anything else as it is.
function M.as_function(v)
  if is_graph(v) then return function() return v:replay() end end
  return v
end

function M.install(tp)
  tp.graph = M.graph
  tp.is_graph = is_graph
  tp.is_capturing = function() return C.tpsh_graph_capturing ~= 0 end
end

return M
