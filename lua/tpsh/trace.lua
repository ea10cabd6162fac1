-- trace.lua: tp.trace (API.md "Measuring and comparing"): start, stop, clear, summary, save, svg, and
-- --trace FILE.
--
-- The recording itself is C (src/core/trace.c): every op, collective, stream wait and host block of
-- this rank becomes a record with its stream, timed by events on the device and resolved to this
-- rank's host clock when read. This file reads the records, aligns the ranks' clocks to rank 0 (a few
-- MPI ping-pongs, the smallest round trip wins), gathers them to rank 0 and writes them out: a Chrome
-- trace (one process per rank, one thread per stream, opened by Perfetto or chrome://tracing) or an
-- SVG timeline (trace_svg.lua). save, svg and summary are collective: every rank calls them.
-- Spans (tp.trace.span, and tp.compare's variants) name stretches of the script's time on a track of
-- their own, so that a timeline says which variant, warm-up or timed iteration each op belongs to; the
-- script's ranges (tp.range: range.lua) are on another, nested by their depth.
local ffi = require "ffi"
local buffer = require "string.buffer"
local capi = require "tpsh.capi"
local values = require "tpsh.values"
local C, check, raise = capi.C, capi.check, capi.raise

local M = {}

M.categories = { [0] = "compute", [1] = "comm", [2] = "wait", [3] = "host", [4] = "span", [5] = "range" }
local HOST_TID = 999999   -- the host track's thread id in Chrome traces (a stream's is its id + 1)
local SPAN_TID = 999998   -- the spans' track
local RANGE_TID = 999997  -- the ranges' track

function M.start() check(C.tpsh_trace_start(), "tp.trace.start") end
function M.stop() check(C.tpsh_trace_stop(), "tp.trace.stop") end
function M.active() return C.tpsh_trace_active() ~= 0 end
function M.clear() C.tpsh_trace_clear() end

-- The index one past this rank's last record: tp.compare brackets a variant with two of these.
function M.count() return tonumber(C.tpsh_trace_count()) end

-- tp.trace.span(name, fn, ...): runs fn(...) and returns what it returns; while tracing, the time it
-- took on the host becomes a span named name. Spans may nest. A span whose fn raises is not recorded.
local function span_end(name, t0, ...)
  C.tpsh_trace_span(name, t0)
  return ...
end

function M.span(name, fn, ...)
  if type(name) ~= "string" then raise("tp.trace.span", "expected a name (string), got " .. capi.describe(name)) end
  if type(fn) ~= "function" then raise("tp.trace.span", "expected a function, got " .. capi.describe(fn)) end
  return span_end(name, C.tpsh_now_ms(), fn(...))
end

-- ==== reading records =============================================================================
-- This rank's records [from, to) (0-based, as M.count), resolved: a list of
-- { t0, t1, category name, stream index (-1: host), name, args, bytes, seq, unfinished }. Waits for the
-- traced work. (unfinished: true for an op a failed run ended in, M._save_own; else nil.)
function M.records(from, to)
  for i, v in ipairs { from or 0, to or 0 } do
    if type(v) ~= "number" or v ~= math.floor(v) or v < 0 then
      raise("tp.trace.records", ("argument %d: expected a record index >= 0 (tp.trace.count()), got %s"):format(
        i, capi.show(v)))
    end
  end
  check(C.tpsh_trace_resolve(), "tp.trace")
  local n = M.count()
  from, to = math.min(from or 0, n), math.min(to or n, n)
  local r = C.tpsh_trace_records()
  local out = {}
  for i = from, to - 1 do
    local x = r[i]
    if x.category >= 0 then
      out[#out + 1] = { x.t0, x.t1, M.categories[x.category], x.stream, ffi.string(x.name), ffi.string(x.args),
        x.bytes, tonumber(x.seq), x.unfinished ~= 0 or nil }
    end
  end
  return out
end

function M.streams()
  local s = {}
  for i = 0, C.tpsh_trace_stream_count() - 1 do
    s[i] = { id = tonumber(C.tpsh_trace_stream_id(i)), name = ffi.string(C.tpsh_trace_stream_name(i)) }
  end
  return s
end

-- ==== interval algebra (HTA's overlap) ============================================================
-- The union of intervals {a, b}, as a sorted list of disjoint intervals.
local function union(iv)
  table.sort(iv, function(x, y) return x[1] < y[1] end)
  local out = {}
  for _, x in ipairs(iv) do
    local last = out[#out]
    if last and x[1] <= last[2] then
      if x[2] > last[2] then last[2] = x[2] end
    else
      out[#out + 1] = { x[1], x[2] }
    end
  end
  return out
end

local function length(u)
  local s = 0
  for _, x in ipairs(u) do s = s + (x[2] - x[1]) end
  return s
end

-- Length of the intersection of two unions (a sweep over both sorted lists).
local function intersection(a, b)
  local i, j, s = 1, 1, 0
  while i <= #a and j <= #b do
    local lo, hi = math.max(a[i][1], b[j][1]), math.min(a[i][2], b[j][2])
    if hi > lo then s = s + hi - lo end
    if a[i][2] < b[j][2] then i = i + 1 else j = j + 1 end
  end
  return s
end

-- Compute, communication and idle time of a list of records (M.records; by default all of this
-- rank's), in ms, and overlap = time computing while communicating / time communicating (0 without
-- communication). Idle: time in [first device op, last device op] when no compute or comm runs on any stream. Host
-- blocks and spans are not device time.
local device_time = { compute = true, comm = true, wait = true }

function M.stats(recs)
  if recs == nil then recs = M.records()
  elseif type(recs) ~= "table" then
    raise("tp.trace.stats", "expected a list of records (tp.trace.records()) or nothing, got " .. capi.describe(recs))
  end
  local comp, comm, busy = {}, {}, {}
  local lo, hi = math.huge, -math.huge
  for i, r in ipairs(recs) do
    -- a record of tp.trace.records(): { start ms, end ms, category, ... }
    if type(r) ~= "table" or type(r[1]) ~= "number" or type(r[2]) ~= "number" or type(r[3]) ~= "string" then
      raise("tp.trace.stats", ("expected a list of records (tp.trace.records()), each {start ms, end ms, "
        .. "category, ...}; item %d is %s"):format(i, type(r) == "table" and "a table that is not one"
        or capi.describe(r)))
    end
    local cat = r[3]
    if device_time[cat] then
      lo, hi = math.min(lo, r[1]), math.max(hi, r[2])
      if cat == "compute" then comp[#comp + 1] = { r[1], r[2] } end
      if cat == "comm" then comm[#comm + 1] = { r[1], r[2] } end
      if cat == "compute" or cat == "comm" then busy[#busy + 1] = { r[1], r[2] } end
    end
  end
  local uc, um = union(comp), union(comm)
  local c, m = length(uc), length(um)
  local both = intersection(uc, um)
  local window = hi > lo and hi - lo or 0
  return { compute = c, comm = m, overlap = m > 0 and math.min(1, both / m) or 0, overlapped = both,
    idle = math.max(0, window - length(union(busy))), window = window, records = #recs }
end

-- ==== collecting all ranks ========================================================================
-- Every rank calls it; rank 0 gets a list (by rank + 1) of { rank, streams, records, dropped, clock }
-- with times in ms on rank 0's clock; other ranks get nil. clock = { offset, rtt } where the offset was
-- estimated (a rank on another host than rank 0's): the times are off by at most rtt / 2.
-- M._clock_rounds < 0 estimates it on one host too (trace_spec tests that path).
M._clock_rounds = 16
local function collect()
  local off, rtt = ffi.new("double[1]"), ffi.new("double[1]")
  check(C.tpsh_trace_clock_offset(values.group_ptr(), M._clock_rounds, off, rtt), "tp.trace")
  local recs = M.records()
  for _, r in ipairs(recs) do r[1], r[2] = r[1] - off[0], r[2] - off[0] end
  return values.gather({ rank = C.tpsh_rank(), streams = M.streams(), records = recs, dropped =
    tonumber(C.tpsh_trace_dropped()), clock = rtt[0] > 0 and { off[0], rtt[0] } or nil }, 0)
end
M._collect = collect

-- "rank 1 dropped 1234, ..." for the ranks of list (each { rank, dropped }) that could not keep every
-- record (the trace's record limit), or nil when none: for the summary's note and the SVG's.
function M._dropped_text(list)
  local full = {}
  for _, p in ipairs(list) do
    if (p.dropped or 0) > 0 then full[#full + 1] = ("rank %d dropped %d"):format(p.rank, p.dropped) end
  end
  return #full > 0 and table.concat(full, ", ") or nil
end

-- The earliest time of all ranks: the origin of the written timelines.
local function origin(all)
  local t = math.huge
  for _, p in ipairs(all) do
    for _, r in ipairs(p.records) do if r[1] < t then t = r[1] end end
  end
  return t == math.huge and 0 or t
end
M._origin = origin

-- ==== Chrome trace JSON ===========================================================================
-- Names come from scripts (stream names, span labels) and may hold any bytes; the trace files must stay
-- valid UTF-8 (JSON and XML parsers refuse the file otherwise).
local utf8_clean = require("tpsh.utf8").clean

local escapes = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }
local function jstr(s)
  return '"' .. utf8_clean(s):gsub('[%c"\\]', function(c) return escapes[c] or ("\\u%04x"):format(c:byte()) end) .. '"'
end

-- Times in whole ns, written as us with three decimals: a box's end is rounded once, as the next box's
-- start is, so that back-to-back ops on one stream never overlap by a rounding step (Perfetto drops a
-- complete event that overlaps its predecessor on the track without nesting in it).
local function ns(ms) return math.floor(ms * 1e6 + 0.5) end
local function us(n) return ("%.3f"):format(n / 1000) end

local function chrome_json(all)
  local t0 = origin(all)
  local b = buffer.new()
  -- otherData says how many records each rank could not keep (the trace's record limit): a timeline
  -- with holes must say so where it is read; and, for ranks whose clock was estimated by ping-pong
  -- (another host than rank 0's), the offset taken from their times and how far off they may still
  -- be: half the round trip kept
  local dropped, clocks, ended = {}, {}, {}
  for _, p in ipairs(all) do
    if (p.dropped or 0) > 0 then dropped[#dropped + 1] = ('"%d":%d'):format(p.rank, p.dropped) end
    if p.ended then
      ended[#ended + 1] = ('"%d":{"status":%d,"ops_not_finished":%d,"ops_not_started":%d%s}'):format(p.rank,
        p.ended.status, p.ended.unfinished, p.ended.not_started,
        p.ended.message and ',"message":' .. jstr(p.ended.message) or "")
    end
    if p.clock then
      clocks[#clocks + 1] = ('"%d":{"offset_ms":%.6f,"uncertainty_ms":%.6f}'):format(p.rank, p.clock[1],
        p.clock[2] / 2)
    end
  end
  b:put('{"displayTimeUnit":"ms","otherData":{"tool":"tpsh"')
  if #dropped > 0 then b:put(',"dropped_records_by_rank":{', table.concat(dropped, ","), '}') end
  if #clocks > 0 then b:put(',"clock_alignment_by_rank":{', table.concat(clocks, ","), '}') end
  if #ended > 0 then b:put(',"run_ended_by_failure":{', table.concat(ended, ","), '}') end
  b:put('},"traceEvents":[\n')
  local first = true
  local function ev(s)
    if not first then b:put(",\n") end
    first = false
    b:put(s)
  end
  for _, p in ipairs(all) do
    -- Process and thread ids start at 1: Perfetto takes pid 0 and tid 0 for the kernel's idle task
    -- (swapper) and its maintainers ask synthesized traces to avoid them (google/perfetto#394). The
    -- names say which rank and stream a track is; the sort indexes keep rank 0 first.
    local pid = p.rank + 1
    ev(('{"ph":"M","name":"process_name","pid":%d,"tid":0,"args":{"name":"rank %d"}}'):format(pid, p.rank))
    ev(('{"ph":"M","name":"process_sort_index","pid":%d,"tid":0,"args":{"sort_index":%d}}'):format(pid, p.rank))
    ev(('{"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":"host"}}'):format(pid, HOST_TID))
    ev(('{"ph":"M","name":"thread_sort_index","pid":%d,"tid":%d,"args":{"sort_index":-1}}'):format(pid, HOST_TID))
    local has = {}
    for _, r in ipairs(p.records) do has[r[3]] = true end
    if has.span then
      ev(('{"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":"spans"}}'):format(pid, SPAN_TID))
      ev(('{"ph":"M","name":"thread_sort_index","pid":%d,"tid":%d,"args":{"sort_index":-2}}'):format(pid, SPAN_TID))
    end
    if has.range then
      ev(('{"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":"ranges"}}'):format(pid, RANGE_TID))
      ev(('{"ph":"M","name":"thread_sort_index","pid":%d,"tid":%d,"args":{"sort_index":-3}}'):format(pid, RANGE_TID))
    end
    for _, s in pairs(p.streams) do
      ev(('{"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":%s}}'):format(pid, s.id + 1, jstr(s.name)))
      ev(('{"ph":"M","name":"thread_sort_index","pid":%d,"tid":%d,"args":{"sort_index":%d}}'):format(pid, s.id + 1, s.id))
    end
    for _, r in ipairs(p.records) do
      local s = p.streams[r[4]]
      local tid = s and s.id + 1 or r[3] == "span" and SPAN_TID or r[3] == "range" and RANGE_TID or HOST_TID
      local args
      if r[3] == "range" then
        args = ('"depth":%d'):format(r[8])
        if r[6] ~= "" then args = args .. ',"note":' .. jstr(r[6]) end
      else
        args = r[3] == "span" and "" or ('"bytes":%.0f'):format(r[7])
        if r[6] ~= "" then args = args .. ',"shapes":' .. jstr(r[6]) end
        if r[8] >= 0 then args = args .. (',"seq":%d'):format(r[8]) end
      end
      local b0, b1 = ns(r[1] - t0), ns(r[2] - t0)
      ev(('{"ph":"X","name":%s,"cat":"%s","pid":%d,"tid":%d,"ts":%s,"dur":%s,"args":{%s}}'):format(
        jstr(r[5]), r[3], pid, tid, us(b0), us(math.max(0, b1 - b0)), args))
    end
  end
  b:put("\n]}\n")
  return b:tostring()
end
M._chrome_json = chrome_json

local function write_file(path, text, name)
  local why = capi.write_whole(path, text)   -- names the path; a cut-short file (a full disk) too
  if why then raise(name, "cannot write the file: " .. why) end
end

local function want_path(path, name)
  if type(path) ~= "string" then raise(name, "expected a file name, got " .. capi.describe(path)) end
  if path == "" then raise(name, "expected a file name, got an empty string") end
end

-- Writes the trace of all ranks as Chrome trace JSON (rank 0 writes; every rank calls it).
function M.save(path)
  want_path(path, "tp.trace.save")
  local all = collect()
  if all then write_file(path, chrome_json(all), "tp.trace.save") end
end

-- Writes the timeline of all ranks as an SVG picture (rank 0 writes; every rank calls it).
function M.svg(path, opts)
  want_path(path, "tp.trace.svg")
  local svg = require "tpsh.trace_svg"
  opts = svg.options(opts)
  local all = collect()
  if all then write_file(path, svg.render(all, origin(all), opts), "tp.trace.svg") end
end

-- ==== after a failure ============================================================================
-- --trace FILE is written at a clean end, gathered from every rank. When the run fails instead, the host
-- (main.c, before every rank is ended) calls this on the failing rank: its own records up to now,
-- without waiting for any stream (one may never get further) and without the other ranks (they may be
-- gone, and are being ended). An op that had started but not finished is drawn up to now and named
-- "(not finished)": where each stream stood is what a failed run's timeline is read for. Written to FILE
-- itself on one rank, else beside it with ".rankR" before its extension (two failing ranks must not
-- write one file). message: the error the host reported (the JSON keeps it). Returns the file written
-- and the counts of ops not finished and not started; nil when no --trace was given.
local function own_path(path, rank, size)
  if size == 1 then return path end
  local base, ext = path:match("^(.*[^/])(%.[%w]+)$")
  if base then return ("%s.rank%d%s"):format(base, rank, ext) end
  return ("%s.rank%d"):format(path, rank)
end
M._own_path = own_path

function M._save_own(status, message)
  local path = M._at_exit
  if not path then return nil end
  local counts = ffi.new("int64_t[2]")
  C.tpsh_range_close_open(1)               -- the ranges the run ended in: "(not finished)" below
  C.tpsh_trace_resolve_reached(counts)
  local unfinished, not_started = tonumber(counts[0]), tonumber(counts[1])
  local recs = M.records()                 -- waits for nothing now: every record is resolved
  for _, r in ipairs(recs) do
    if r[9] then r[5] = r[5] .. " (not finished)" end
  end
  local me = { rank = C.tpsh_rank(), streams = M.streams(), records = recs, dropped = tonumber(C.tpsh_trace_dropped()),
    ended = { status = status or 1, unfinished = unfinished, not_started = not_started,
              message = message ~= "" and message or nil } }
  local out = own_path(path, me.rank, C.tpsh_size())
  local text
  if path:lower():match("%.svg$") then
    local svg = require "tpsh.trace_svg"
    local what = (unfinished > 0 or not_started > 0) and (", %d op%s not finished, %d not started"):format(
      unfinished, unfinished == 1 and "" or "s", not_started) or ""
    text = svg.render({ me }, origin({ me }), { title = ("tpsh trace: rank %d up to a failed run's end (status %d%s)"):format(
      me.rank, me.ended.status, what) })
  else
    text = chrome_json({ me })
  end
  local why = capi.write_whole(out, text)
  if why then error(why, 0) end
  return out, unfinished, not_started
end

-- The line a run that ends early says of --trace FILE (main.c's die; capi.lua's give_way, where the
-- watchdog or a signal ends it): where this rank's own records went (M._save_own), or why they did not.
-- nil without --trace.
function M._own_line(status, message)
  local path = M._at_exit
  if not path then return nil end
  local head = ("tpsh: --trace %s was not written: the run ended with status %d"):format(path, status)
  local ok, out, unfinished, not_started = pcall(M._save_own, status, message)
  if not ok then return ("%s (nor were this rank's own records: %s)"):format(head, tostring(out)) end
  local counts = ""
  if unfinished > 0 or not_started > 0 then
    counts = (" (%d op%s not finished, %d not started)"):format(unfinished, unfinished == 1 and "" or "s", not_started)
  end
  if C.tpsh_size() == 1 then
    return ("tpsh: the run ended with status %d; --trace %s holds its records up to then%s"):format(status, out, counts)
  end
  return ("%s; this rank's own records up to then are in %s%s"):format(head, out, counts)
end

-- ==== summary =====================================================================================
-- Per rank: compute, comm, overlap, idle. Returns the list (by rank + 1) on every rank; rank 0 prints it.
function M.summary(opts)
  if type(opts) ~= "nil" and type(opts) ~= "table" then     -- (a NULL pointer cdata equals nil)
    raise("tp.trace.summary", "expected a table of options, got " .. capi.describe(opts))
  end
  opts = opts or {}
  capi.check_options("tp.trace.summary", opts, { quiet = true })
  capi.want_flag("tp.trace.summary", opts, "quiet")
  local mine = M.stats(M.records())
  mine.rank, mine.dropped = C.tpsh_rank(), tonumber(C.tpsh_trace_dropped())
  -- the watchdog names this call, not the tp.allgather inside it, when a rank never comes
  local all = values.allgather(mine, nil, nil, "tp.trace.summary (a host-side exchange: every rank must call it)")
  if C.tpsh_rank() == 0 and not opts.quiet then
    print(("%-6s %12s %12s %8s %10s %8s"):format("rank", "compute ms", "comm ms", "overlap", "idle ms", "records"))
    for _, s in ipairs(all) do
      print(("%-6d %12.3f %12.3f %8.2f %10.3f %8d"):format(s.rank, s.compute, s.comm, s.overlap, s.idle, s.records))
    end
    local dropped = M._dropped_text(all)
    if dropped then
      print("note: the trace was full, later records were not kept (" .. dropped .. "): the figures cover the kept ones")
    end
  end
  return all
end

-- ==== install =====================================================================================
function M.install(tp)
  tp.trace = {
    start = M.start, stop = M.stop, clear = M.clear, active = M.active, save = M.save, svg = M.svg,
    summary = M.summary, records = M.records, stats = M.stats, count = M.count, span = M.span,
  }
  -- --trace FILE: on from initialisation, written at exit (FILE.svg: the picture, else JSON).
  tp._on_configure(function(cfg)
    if not cfg.trace or M._at_exit then return end
    -- Rank 0 writes FILE at exit: find out now, not after the whole run, that it cannot; and tell every
    -- rank, so that none starts the script (rank 1 ran its first lines before rank 0's error ended it).
    local why = tp.bcast(C.tpsh_rank() == 0 and capi.unwritable(cfg.trace) or false, 0)
    if why then error("--trace: cannot write the trace: " .. why, 0) end
    M._at_exit = cfg.trace
    M.start()
    tp._on_finish(function()
      if cfg.trace:lower():match("%.svg$") then M.svg(cfg.trace) else M.save(cfg.trace) end
    end)
  end)
end

return M
