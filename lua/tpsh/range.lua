-- range.lua: tp.range, tp.range_push, tp.range_pop (API.md "Named ranges"): phases of the script that
-- a timeline names, nested on one stack (src/core/range.c). Each closed range is a record on its own
-- track of tpsh's trace (trace.lua, trace_svg.lua) and, in a build with CUDA, an NVTX range.
local ffi = require "ffi"
local capi = require "tpsh.capi"
local C, check, raise = capi.C, capi.check, capi.raise
local ffi_string = ffi.string
local location = require("tpsh.check").location

local M = {}

local function want_name(name, fname)
  if type(name) ~= "string" then raise(fname, "expected a name (string), got " .. capi.describe(name)) end
  if name == "" then raise(fname, "expected a name, got an empty string") end
  if name:find("\0", 1, true) then raise(fname, "the name must not hold a NUL byte, got " .. capi.show(name)) end
end

function M.push(name)
  want_name(name, "tp.range_push")
  check(C.tpsh_range_push(name, location()), "tp.range_push")
end

-- tp.range_pop([name]): closes the innermost range; with a name, only if it is that one.
function M.pop(name)
  if name ~= nil then want_name(name, "tp.range_pop") end
  check(C.tpsh_range_pop(name), "tp.range_pop")
end

local function open_at(depth)
  return ("'%s' (pushed at %s)"):format(ffi_string(C.tpsh_range_name(depth)), ffi_string(C.tpsh_range_where(depth)))
end

-- tp.range's way out: its own range must be the innermost again; fn's error closes what fn left open.
local function range_end(depth, name, ok, ...)
  if not ok then
    C.tpsh_range_pop_to(depth, "closed by an error raised inside it")
    error((...), 0)
  end
  local now = C.tpsh_range_depth()
  if now > depth + 1 then
    local left = open_at(now - 1)
    C.tpsh_range_pop_to(depth, nil)
    raise("tp.range", ("the function left the range %s open (a tp.range_push without its tp.range_pop) "
      .. "inside '%s'"):format(left, name))
  elseif now <= depth then
    raise("tp.range", ("the function closed the range '%s' that tp.range opened (a tp.range_pop without "
      .. "its tp.range_push)"):format(name))
  end
  C.tpsh_range_pop(nil)
  return ...
end

function M.range(name, fn, ...)
  want_name(name, "tp.range")
  if type(fn) ~= "function" then raise("tp.range", "expected a function as argument 2, got " .. capi.describe(fn)) end
  local depth = C.tpsh_range_depth()
  check(C.tpsh_range_push(name, location()), "tp.range")
  return range_end(depth, name, pcall(fn, ...))
end

-- The ranges open now, outermost first, as "'name' (pushed at file:line)".
function M.open()
  local out = {}
  for d = 0, C.tpsh_range_depth() - 1 do out[#out + 1] = open_at(d) end
  return out
end

-- `tpsh test` after each test: nil, or the failure of a test that left ranges open above depth (closed).
function M.left_open(depth)
  if C.tpsh_range_depth() <= depth then return nil end
  local open = {}
  for d = depth, C.tpsh_range_depth() - 1 do open[#open + 1] = open_at(d) end
  C.tpsh_range_pop_to(depth, "left open by the test")
  return "the test left " .. table.concat(open, ", ") .. " open (a tp.range_push without its tp.range_pop)"
end

function M.install(tp)
  tp.range, tp.range_push, tp.range_pop = M.range, M.push, M.pop
  tp._range_depth = function() return C.tpsh_range_depth() end      -- (specs)
  -- A range still open at the end of the script is said, and closed there (its record ends there).
  tp._on_finish(function()
    local open = M.open()
    if #open == 0 then return end
    local shown = { unpack(open, 1, 8) }               -- the outermost; a loop's thousand say no more
    if #open > 8 then shown[9] = ("and %d more"):format(#open - 8) end
    io.stderr:write(("[rank %d] tpsh: warning: %d range%s left open at the end of the script (a tp.range_push "
      .. "without its tp.range_pop), closed there: %s\n"):format(C.tpsh_rank(), #open, #open == 1 and " was" or "s were",
      table.concat(shown, ", ")))
    C.tpsh_range_close_open(0)
  end)
end

return M
