-- tpsh.test_run: running the spec files of `tpsh test`, block by block, test by test, on every rank.
--
-- As busted does, a file's chunk runs when the runner comes to the file, and a describe body when it
-- comes to the block, in order with the tests before it: the body registers the block's children,
-- the block's setup runs, then the children in order (shuffled where asked), then its teardown. The
-- whole design rests on one rule: every rank makes the same sequence of exchanges whatever its tests do.
--   * after each body ONE exchange tells every rank how it went on every rank and what it registered:
--     a body that failed, or registered other children, on some rank fails the block on all ranks alike
--     (its children do not run);
--   * every test (and its hooks) runs inside xpcall, then ONE exchange per test tells every rank the
--     outcome on every rank. A failing assert can never skip an exchange of the runner;
--   * the ranks also agree after each setup and each level of before_each hooks, so that a test body
--     (or an inner hook) runs on every rank or on none;
--   * after each step that ran spec code, the records of what each rank issued on each group are
--     compared (tpsh.test_exchange): collectives left waiting, or sends left unmatched, stop the run.
-- A test passes only when it passes on all ranks; a failure names its ranks and each distinct message.
local ffi = require "ffi"
local D = require "tpsh.test_dsl"
local exchange = require "tpsh.test_exchange"
local select_ = require "tpsh.test_select"
local output = require "tpsh.test_output"
local range = require "tpsh.range"
local chaos = require "tpsh.chaos"

local M = {}
local concat, fmt, insert = table.concat, string.format, table.insert
local fail_record = output.fail_record
local S, handler, error_text, PENDING = D.state, D.handler, D.error_text, D.PENDING
local OUT_OF_STEP = exchange.OUT_OF_STEP

---------------------------------------------------------------------------------------------------
-- Clock (symbols renamed with __asm__ so they cannot clash with the host's cdefs)
---------------------------------------------------------------------------------------------------

local C = ffi.C
local have_ffi = pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } tpsh_test_timespec;
int tpsh_test_clock_gettime(int clk, tpsh_test_timespec *ts) __asm__("clock_gettime");
]])
local ts = have_ffi and ffi.new("tpsh_test_timespec")

-- Wall time, monotonic: os.clock is CPU time and would miss a test that waits on a collective.
function M.now()
  if ts and C.tpsh_test_clock_gettime(1 --[[CLOCK_MONOTONIC]], ts) == 0 then
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
  end
  return os.clock()
end
local now = M.now

---------------------------------------------------------------------------------------------------
-- Helpers
---------------------------------------------------------------------------------------------------

-- Adds a rank's named errors ({name, file, line, msg}) to groups, one group per name, in order.
local function group(groups, errs, rank)
  for _, e in ipairs(errs or {}) do
    if not groups[e.name] then groups[e.name] = { e = e, entries = {} }; insert(groups, groups[e.name]) end
    insert(groups[e.name].entries, { rank, e.msg })
  end
end

local function chain_of(t)
  local c, b = {}, t.parent
  while b do insert(c, 1, b); b = b.parent end
  return c
end

local function block_label(b) return b.full ~= "" and b.full or b.file end

-- Check mode: the text of the sanitizer reports made since mark and still held (nil: none), which are
-- then cleared so that what follows starts clean. A full collection first: a tensor dropped while a
-- stream still used it is freed (and reported) here, in the step that dropped it, and not in whichever
-- later test the collector happens to run in.
local function reports_left(x, mark)
  if not mark then return nil end
  if x.check.enabled() then collectgarbage(); collectgarbage() end
  local left = x.check._since(mark)
  if #left == 0 then return nil end
  x.check.clear()
  return "the stream sanitizer reported:\n" .. concat(left, "\n")
end

-- Runs hooks (setup, teardown and their lazy forms), each followed by the finally() handlers it
-- registered; returns nil or the first error's text (a sanitizer report the hooks left is one).
local function run_hooks(fns, kind, label, x)
  local mark = #fns > 0 and x.check and x.check._mark()
  for _, fn in ipairs(fns) do
    S.phase, S.finally = "run", {}
    local err
    local ok, e = xpcall(fn, handler)
    if not ok then err = kind .. " of '" .. label .. "' failed: " .. error_text(type(e) == "table" and e.reason or e) end
    for i = #S.finally, 1, -1 do
      local okf, ef = xpcall(S.finally[i], handler)
      if not okf and not err then
        err = "finally in " .. kind .. " of '" .. label .. "' failed: " .. error_text(type(ef) == "table" and ef.reason or ef)
      end
    end
    S.phase, S.finally = nil, nil
    if err then return err end
  end
  local left = reports_left(x, mark)
  return left and (kind .. " of '" .. label .. "': " .. left) or nil
end

-- An insulated block's view of the tables it protects, taken when it is entered: _G, package.loaded
-- and the spec file's globals (env; nil for a file, whose globals go with it), raw copies of each.
local function snapshot(env)
  local tabs, copies = { _G, package.loaded, env }, {}
  for i, t in ipairs(tabs) do
    local c = {}
    for k, v in next, t do c[k] = v end
    copies[i] = c
  end
  return { tabs = tabs, copies = copies }
end

local function restore(snap)
  for i, t in ipairs(snap.tabs) do
    local c, added = snap.copies[i], {}
    for k in next, t do if c[k] == nil then added[#added + 1] = k end end
    for _, k in ipairs(added) do rawset(t, k, nil) end
    for k, v in next, c do if rawget(t, k) ~= v then rawset(t, k, v) end end
  end
end

---------------------------------------------------------------------------------------------------
-- One test
---------------------------------------------------------------------------------------------------

-- Runs hooks and body of one test on this rank; returns the payload that is exchanged.
-- The body runs only when every rank is ready: a setup or before_each that failed on one rank
-- would otherwise leave the others alone in the body's collectives. The ranks agree after each
-- level of before_each hooks (so that an inner hook's collectives are called by all or none);
-- after_each hooks run from the level whose before_each failed outward, as in busted.
local function run_one(R, t, chain)
  local x, state = R.x, R.state
  local t0 = now()
  local res = { ok = true }
  if t.pending then
    res.skip = true
    return res
  end
  local errs, blocked = {}, false
  for _, b in ipairs(chain) do
    local st = state[b]
    if st and st.blocked then
      blocked = true
      if st.err then errs[1] = st.err end
      break
    end
  end
  if not blocked then
    local mark = x.check and x.check._mark()
    local depth = C.tpsh_range_depth()   -- ranges the test leaves open fail it
    chaos.restart()
    local snap = R.luassert:snapshot()   -- spies and stubs are reverted after each test
    S.phase, S.finally = "run", {}
    -- "ok", "fail" or "skip" (pending() was called)
    local function call(label, fn)
      local ok, e = xpcall(fn, handler)
      if ok then return "ok" end
      if type(e) == "table" and e[PENDING] then res.skip, res.reason = true, e.reason; return "skip" end
      errs[#errs + 1] = label and (label .. ": " .. e) or e
      return "fail"
    end
    local go, last = true, #chain   -- last: the innermost level whose after_each hooks are due
    for k, b in ipairs(chain) do
      if #b.before_each > 0 then
        local label = "before_each of '" .. block_label(b) .. "'"
        local mine
        for _, fn in ipairs(b.before_each) do
          local r = call(label .. " failed", fn)
          if r ~= "ok" then
            mine = r == "fail" and { err = errs[#errs] } or { skip = res.reason or "pending" }
            break
          end
        end
        if x.agree(mine, fmt("test '%s', after %s", t.full, label)) ~= "ok" then go, last = false, k; break end
      end
    end
    if go then call(nil, t.fn) end
    for i = #S.finally, 1, -1 do call("finally failed", S.finally[i]) end
    for i = last, 1, -1 do
      for _, fn in ipairs(chain[i].after_each) do call("after_each of '" .. block_label(chain[i]) .. "' failed", fn) end
    end
    S.phase, S.finally = nil, nil
    pcall(snap.revert, snap)
    -- Check mode: a report the test made and left (one that provokes a race on purpose reads the
    -- reports and clears them) fails it; an identical race in the next test is reported again.
    errs[#errs + 1] = reports_left(x, mark)
    errs[#errs + 1] = range.left_open(depth)
  end
  if #errs > 0 then res.ok, res.skip, res.msg = false, nil, concat(errs, "\n") end
  res.t = now() - t0
  return res
end

-- The lazy_setup hooks of the test's blocks that have not run yet, outermost first; the ranks agree
-- after each, and a failure blocks the block's tests (they fail naming the ranks, as a setup's do).
local function lazy_setups(R, t, chain)
  for k, b in ipairs(chain) do
    if not R.state[b] then
      local parent = k > 1 and R.state[chain[k - 1]] or nil
      local st = { lazy = #b.lazy_setup > 0 }
      if parent and parent.blocked then
        st.blocked, st.err = true, parent.err
      elseif st.lazy then
        st.err = run_hooks(b.lazy_setup, "lazy_setup", block_label(b), R.x)
        st.blocked = R.x.agree(st.err and { err = st.err }, fmt("test '%s', after lazy_setup of '%s'", t.full,
          block_label(b))) ~= "ok"
      end
      R.state[b] = st
    end
  end
end

local function run_test(R, t)
  if not select_.selected(R.o, t) then return end
  if R.o.list then R.out(t.full .. "\n"); return end
  local x = R.x
  x.test = t
  x.begin_test(fmt("test '%s' (%s:%d)", t.full, t.file, t.line))
  local chain = chain_of(t)
  if not t.pending then lazy_setups(R, t, chain) end
  local res = run_one(R, t, chain)
  local late = exchange.async_error_left()
  if late then
    local what = "an asynchronous error, noted during the test and raised by none of its calls: " .. late
    if res.ok then res.ok, res.msg = false, what else res.msg = tostring(res.msg) .. "\n" .. what end
  end
  -- Every rank learns every rank's outcome.
  -- The step's words also say how the test went here: should the other ranks never come (stuck in a
  -- collective this rank left when it failed), the watchdog's message still carries the failure.
  local here = res.ok and "" or ("; on this rank it failed: " .. tostring(res.msg or "?"):match("^[^\n]*"))
  local failure = not res.ok and fmt("test '%s': %s", t.full, tostring(res.msg)) or nil
  local all = x.all(exchange.records(res), fmt("test '%s', its result", t.full), here, failure)
  local differ, stop = exchange.step_checks(x, all, fmt("test '%s'", t.full))
  local fails, skip, reason, tmax = {}, false, nil, 0
  for r, p in ipairs(all) do
    if not p.ok then insert(fails, { r - 1, p.msg or "?" })
    elseif p.skip then skip, reason = true, reason or p.reason end
    tmax = math.max(tmax, p.t or 0)
  end
  for _, e in ipairs(differ or {}) do insert(fails, e) end
  local classname = t.parent.full ~= "" and t.parent.full or t.file
  if #fails > 0 then
    R.emit(fail_record(t.full, classname, t.file, t.line, fails, tmax))
  else
    R.emit({ name = t.full, classname = classname, file = t.file, line = t.line, time = tmax,
             status = skip and "skip" or "pass", reason = reason, ranks = {}, failures = {} })
  end
  if stop then error(stop, 0) end
end

---------------------------------------------------------------------------------------------------
-- Blocks
---------------------------------------------------------------------------------------------------

-- Where two ranks' lists of children (sig: one a line) first differ, said for the error.
local function first_difference(mine, theirs)
  local a, b = {}, {}
  for l in (mine .. "\n"):gmatch("(.-)\n") do a[#a + 1] = l end
  for l in (theirs .. "\n"):gmatch("(.-)\n") do b[#b + 1] = l end
  for k = 1, math.max(#a, #b) do
    if a[k] ~= b[k] then
      local function say(l) return not l and "nothing" or fmt("%q", l) end
      return fmt("; the first difference: %s here, %s on rank 0", say(a[k]), say(b[k]))
    end
  end
  return ""
end

-- A block's hooks that run once (setup, teardown and their lazy forms), then ONE exchange of their
-- errors and records. Returns true where they failed on no rank.
local function block_hooks(R, b, fns, kind)
  if #fns == 0 or R.o.list then return true end
  local label = block_label(b)
  R.x.begin_test(fmt("%s of '%s' (%s:%d)", kind, label, b.file, b.line or 0))
  local err = run_hooks(fns, kind, label, R.x)
  local what = fmt("%s of '%s'", kind, label)
  local all = R.x.all(exchange.records({ err = err }), what, err and ("; on this rank it failed: " .. err:match("^[^\n]*")),
    err and (what .. ": " .. err))
  local differ, stop = exchange.step_checks(R.x, all, what)
  local entries = {}
  for r, p in ipairs(all) do if p.err then insert(entries, { r - 1, p.err }) end end
  for _, e in ipairs(differ or {}) do insert(entries, e) end
  if #entries > 0 then R.emit(fail_record(label .. " (" .. kind .. ")", label, b.file, b.line or 0, entries)) end
  if stop then error(stop, 0) end
  return #entries == 0
end

local run_block

-- The body of block b (a file's chunk when b is a file's root), then ONE exchange: every rank learns
-- whether it ran on every rank and what it registered. Returns true where the children may run.
local function run_body(R, b)
  local x = R.x
  local is_file = b.parent == nil
  local what = is_file and fmt("the loading of %s", b.file) or fmt("the body of describe '%s' (%s:%d)", b.full,
    b.file, b.line)
  x.test = b
  x.begin_test(what)
  local mark = x.check and x.check._mark()
  local err
  if is_file then
    local chunk, e = loadfile(b.file)
    if not chunk then err = e
    else
      b.env = setmetatable({}, { __index = _G })
      setfenv(chunk, b.env)
      err = D.run_body(b, chunk)
    end
  else
    err = D.run_body(b, b.fn)
  end
  -- a sanitizer report the body left fails the block as an error does, but its children still run
  -- (the body did register them all) and no test is charged with it
  local left = reports_left(x, mark)
  left = left and ("while loading: " .. left) or nil
  local sig, count = D.signature(b)
  local failure = (err or left) and (what .. ": " .. (err or left)) or nil
  local all = x.all(exchange.records({ err = err, left = left, sig = sig, count = count }), what,
    failure and ("; on this rank it failed: " .. (err or left):match("^[^\n]*")), failure)
  local differ, stop = exchange.step_checks(x, all, what)
  local loadf, other, broke = {}, {}, false
  for r, p in ipairs(all) do
    if p.err or p.left then insert(loadf, { r - 1, p.err or p.left }) end
    broke = broke or p.err ~= nil
    if p.sig ~= all[1].sig then
      insert(other, { r - 1, fmt("registers other tests than rank 0 (%d against %d)%s", p.count, all[1].count,
        first_difference(p.sig, all[1].sig)) })
    end
  end
  local name = is_file and b.file or b.full
  local classname = is_file and b.file or (b.parent.full ~= "" and b.parent.full or b.file)
  if #loadf > 0 then
    R.emit(fail_record(is_file and name or (name .. " (describe)"), classname, b.file, b.line or 0, loadf))
  elseif #other > 0 then
    R.emit(fail_record(name .. " (ranks disagree on the tests)", classname, b.file, b.line or 0, other))
  end
  if differ then R.emit(fail_record(what, classname, b.file, b.line or 0, differ)) end
  if stop then error(stop, 0) end
  return not broke and #other == 0
end

-- Runs block b: its body, its setup, its children in order, its teardown; insulated blocks (and
-- files, unless --no-auto-insulate) give back _G, package.loaded and the file's globals as they were.
function run_block(R, b)
  local snap = (b.insulated or (b.parent == nil and R.o.auto_insulate)) and snapshot(b.parent and b.env)
  local ok, e = pcall(function()
    if not run_body(R, b) then return end
    local kids = b.children
    local shuffled = b.randomize
    if shuffled == nil then shuffled = R.o.shuffle end
    if shuffled then
      kids = { }
      for i = 1, #b.children do kids[i] = b.children[i] end
      select_.shuffle(kids, select_.new_rng(b.seed or R.seed or 0))
    end
    -- as busted: a setup that failed (on any rank) leaves the children out; the teardown still runs
    if block_hooks(R, b, b.setup, "setup") then
      for _, c in ipairs(kids) do
        if c.kind == "block" then run_block(R, c) else run_test(R, c) end
      end
    end
    local st = R.state[b]
    if st and st.lazy and not st.blocked then block_hooks(R, b, b.lazy_teardown, "lazy_teardown") end
    R.state[b] = nil
    block_hooks(R, b, b.teardown, "teardown")
  end)
  if snap then restore(snap) end
  if not ok then error(e, 0) end
end

-- Runs the spec files, one after the other. R: { x, o, luassert, emit, out, seed }.
function M.run_files(R, files)
  R.state = {}
  for _, path in ipairs(files) do run_block(R, D.new_block("", nil, path, 0, nil)) end
  R.x.end_tests()
end

M.OUT_OF_STEP = OUT_OF_STEP
return M
