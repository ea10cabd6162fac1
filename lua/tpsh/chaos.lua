-- chaos.lua: tp.chaos (API.md "Chaos mode"): seeded random delays before stream work and collectives
-- (src/core/chaos.c), so that a schedule missing a wait gives a wrong result, the same one for the
-- same seed. --chaos[=SEED] and TPSH_CHAOS turn it on from the start (src/host/chaos_flag.c).
--
--   tp.chaos(seed)             on with seed (an integer from 1 to 2^53 - 1): every stream's delays
--                              start again from the seed; returns the seed before (nil: it was off)
--   tp.chaos(false)            off; returns the seed before
--   tp.chaos(seed|false, fn, ...)  fn(...) with that setting, then the one before (its delays from the
--                              start); returns what fn returns
--   tp.chaos()                 the seed (nil when off), the delays enqueued since it was set, their ms
local ffi = require "ffi"
local capi = require "tpsh.capi"
local C, check, raise = capi.C, capi.check, capi.raise

local M = {}

local function seed_now()
  local s = C.tpsh_chaos_seed()
  return s >= 0 and s or nil
end

local function set(seed)
  if seed == false then
    C.tpsh_chaos_set(-1)
    return
  end
  if type(seed) ~= "number" or seed ~= math.floor(seed) or seed < 1 or seed > 2 ^ 53 - 1 then
    raise("tp.chaos", "expected a seed (an integer from 1 to 2^53 - 1) or false, got " .. capi.show(seed))
  end
  check(C.tpsh_chaos_set(seed), "tp.chaos")
end

-- fn's way out: the setting before back in place, also on error
local function restore(was, ok, ...)
  C.tpsh_chaos_set(was or -1)
  if not ok then error((...), 0) end
  return ...
end

local stats = ffi.new("double[2]")

function M.chaos(...)
  local n, seed, fn = select("#", ...), ...
  if n == 0 then
    C.tpsh_chaos_stats(stats)
    return seed_now(), stats[0], stats[1]
  end
  if n >= 2 and type(fn) ~= "function" then
    raise("tp.chaos", "expected a function as argument 2, got " .. capi.describe(fn))
  end
  local was = seed_now()
  set(seed)
  if n == 1 then return was end
  return restore(was, pcall(fn, select(3, ...)))
end

-- `tpsh test` before each test's hooks and body: under chaos each test's delays start from the seed,
-- so that --chaos=SEED with --filter gives a failing test the same delays alone.
function M.restart()
  local s = C.tpsh_chaos_seed()
  if s >= 0 then C.tpsh_chaos_set(s) end
end

function M.install(tp) tp.chaos = M.chaos end

return M
