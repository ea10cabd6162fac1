-- check.lua: tp.check, the Lua side of the stream sanitizer, the collective mismatch check and the
-- watchdog (src/core/sanitizer.c, coll_match.c, flight.c, watchdog*.c).
--
-- Reports name the user's file:line of both accesses. C cannot know Lua lines, so in check mode every
-- public function of tp, of tensors and of groups is replaced by a wrapper that first passes the
-- caller's file:line down (tpsh_check_set_location); the operators (a + b, ...) do the same through
-- capi.locate. Out of check mode the original functions are back in place and capi.locate is nil:
-- nothing is left on the paths of ordinary runs.
--
--   tp.check.enable(on)      check mode on / off (on starts from a clean state); --check, TPSH_CHECK=1
--   tp.check.strict(on)      the first report becomes a Lua error of the call that found it
--                            (TPSH_CHECK=error); a free by the garbage collector is only reported
--   tp.check.reports()       the reports since the last clear: { kind, message, location,
--                            other_location, op, other_op, stream, other_stream, shape }
--   tp.check.clear()         forgets them (and the de-duplication of identical reports)
--   tp.check.enabled(), tp.check.is_strict()
--   tp.check.flight_record() this rank's last 512 collectives as text (what the watchdog prints)
--   tp.check.timeout([sec])  the watchdog's timeout (--timeout, TPSH_TIMEOUT; default 600 s)
local ffi = require "ffi"
local capi = require "tpsh.capi"
local C = capi.C

local M = {}

-- The user's file:line: the first frame above us that is not tpsh's own Lua (embedded modules carry
-- "/lua/tpsh/" in their source) nor C.
local getinfo = debug.getinfo
local function location()
  local level = 3
  while true do
    local info = getinfo(level, "Sl")
    if not info then return "?" end
    local src = info.source
    if info.what ~= "C" and not src:find("/lua/tpsh/", 1, true) then
      if src:sub(1, 1) == "@" then src = src:sub(2) else src = info.short_src end
      return src .. ":" .. (info.currentline or 0)
    end
    level = level + 1
  end
end

local function locate() C.tpsh_check_set_location(location()) end
M.location = location     -- range.lua's "pushed at" too

-- ==== wrapping ===================================================================================
local saved = {}            -- [table] = { [name] = original function }

local function wrapped(f)
  return function(...)
    C.tpsh_check_set_location(location())
    return f(...)
  end
end

local clears = 0   -- tp.check.clear calls, for _since
local function reports_count() return C.tpsh_check_report_count() end

local function report_message(i)
  local r = C.tpsh_check_report_get(i)
  return r ~= nil and ffi.string(r.message) or "tpsh check: report"
end

-- t:free() tells C that the free is explicit (not the garbage collector's); in strict mode a report
-- it causes is raised here, since the free itself cannot fail.
local function wrapped_free(f)
  return function(t, ...)
    C.tpsh_check_set_location(location())
    local before = reports_count()
    C.tpsh_check_set_explicit_free(1)
    local ok, err = pcall(f, t, ...)
    C.tpsh_check_set_explicit_free(0)
    if not ok then error(err, 0) end
    if C.tpsh_check_strict() ~= 0 and reports_count() > before then
      error("tensor:free: " .. report_message(before), 2)
    end
  end
end

local function wrap_table(t, skip)
  if saved[t] then return end
  local orig = {}
  for k, v in pairs(t) do
    if type(v) == "function" and type(k) == "string" and k:sub(1, 1) ~= "_" and not (skip and skip[k]) then
      orig[k] = v
    end
  end
  for k, v in pairs(orig) do t[k] = k == "free" and wrapped_free(v) or wrapped(v) end
  saved[t] = orig
end

local function unwrap_all()
  for t, orig in pairs(saved) do
    for k, v in pairs(orig) do t[k] = v end
  end
  saved = {}
end

local targets = {}          -- filled by install: the tables of public functions

-- ==== the API ====================================================================================
-- on: nil (true) or a boolean; anything else is refused rather than read as truthy (enable("no")).
local function flag_arg(name, on)
  if type(on) ~= "nil" and type(on) ~= "boolean" then     -- (a NULL pointer cdata equals nil)
    capi.raise(name, "expected true, false or nothing, got " .. capi.show(on))
  end
  return on == nil or on
end

local function enable(on)
  on = flag_arg("tp.check.enable", on)
  C.tpsh_check_enable(on and 1 or 0)
  if on then
    for _, x in ipairs(targets) do wrap_table(x.t, x.skip) end
    capi.locate = locate
  else
    unwrap_all()
    capi.locate = nil
  end
end

local function reports()
  local out = {}
  for i = 0, C.tpsh_check_report_count() - 1 do
    local r = C.tpsh_check_report_get(i)
    out[#out + 1] = {
      kind = ffi.string(r.kind), message = ffi.string(r.message), location = ffi.string(r.location),
      other_location = ffi.string(r.other_location), op = ffi.string(r.op), other_op = ffi.string(r.other_op),
      stream = ffi.string(r.stream), other_stream = ffi.string(r.other_stream), shape = ffi.string(r.shape),
    }
  end
  return out
end

local function flight_record()
  local p = C.tpsh_flight_record_text()
  if p == nil then return "" end
  local s = ffi.string(p)
  C.tpsh_free_buffer(p)
  return s
end

function M.install(tp)
  local check = {
    enable = enable,
    enabled = function() return C.tpsh_check_enabled() ~= 0 end,
    strict = function(on) C.tpsh_check_set_strict(flag_arg("tp.check.strict", on) and 1 or 0) end,
    is_strict = function() return C.tpsh_check_strict() ~= 0 end,
    reports = reports,
    clear = function() clears = clears + 1; C.tpsh_check_clear() end,
    -- For the test runner: a mark before a test, and the messages of the reports made since that are
    -- still held (a test that provokes a race on purpose reads the reports and clears them).
    _mark = function() return { n = reports_count(), clears = clears } end,
    _since = function(mark)
      local from = mark.clears == clears and mark.n or 0
      local out = {}
      for i = from, reports_count() - 1 do out[#out + 1] = report_message(i) end
      return out
    end,
    flight_record = flight_record,
    timeout = function(sec)
      if sec ~= nil then
        if type(sec) ~= "number" or not (sec > 0 and sec < math.huge) then
          capi.raise("tp.check.timeout", "expected a finite number of seconds > 0, got " .. capi.show(sec))
        end
        C.tpsh_watchdog_set_timeout(sec)
      end
      return C.tpsh_watchdog_timeout()
    end,
  }
  tp.check = check
  -- What check mode wraps: tp's functions (not tp.check itself, nor the clock), tensor methods, and
  -- group methods when groups are built in.
  targets = { { t = tp, skip = { now = true, is_tensor = true, is_stream = true, is_group = true, is_work = true } },
              { t = require("tpsh.tensor").methods } }
  targets[#targets + 1] = { t = require("tpsh.group").methods }
  tp._on_configure(function(cfg)
    if cfg.timeout then C.tpsh_watchdog_set_timeout(cfg.timeout) end
    local env = os.getenv("TPSH_CHECK")
    if env == "error" or env == "strict" then check.strict(true) end
    if cfg.check then enable(true) end
  end)
  -- At the end of a script, reports still held make the exit status 66 (ThreadSanitizer's), so that a
  -- script run with --check in a pipeline fails where the sanitizer found something. The reports
  -- themselves were printed as they were made.
  tp._on_finish(function()
    local n = reports_count()
    if n == 0 then return 0 end
    io.stdout:flush()
    io.stderr:write(("[rank %d] tpsh: the stream sanitizer made %d report%s (printed above): exit status 66\n")
      :format(tp.rank, n, n == 1 and "" or "s"))
    return 66
  end)
end

return M
