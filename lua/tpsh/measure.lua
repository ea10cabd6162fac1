-- measure.lua: tp.time and tp.compare (API.md "Measuring and comparing").
--
-- tp.time times what a function enqueues with two timing events on the current stream around each
-- iteration (device time: what the stream spent, including waits for other streams and collectives),
-- and also notes the host time of each call (how long the function took to return: the cost of
-- enqueueing, or a host block hiding inside). Each iteration is synchronised and, with several ranks,
-- preceded by a barrier, so that one iteration's tail never overlaps the next one's head and a late
-- rank does not count against the others; opts.sync = false lets iterations run back to back.
--
-- tp.compare runs each variant that way on every rank, one after the other with a barrier in
-- between, gathers every rank's figures to every rank and prints one table on rank 0. With tracing on
-- (tp.trace.start() or --trace), the records of each variant's timed iterations also give its
-- communication time, compute time and overlap (trace.lua's HTA definition).
local ffi = require "ffi"
local capi = require "tpsh.capi"
local stream = require "tpsh.stream"
local tensor = require "tpsh.tensor"
local values = require "tpsh.values"
local trace = require "tpsh.trace"
local memory = require "tpsh.memory"
local graph = require "tpsh.graph"
local C, check, raise = capi.C, capi.check, capi.raise
local mstats = memory.stats

pcall(ffi.cdef, "int isatty(int fd);")

local M = {}

-- ==== statistics ==================================================================================
local function median(xs)
  local s = {}
  for i, v in ipairs(xs) do s[i] = v end
  table.sort(s)
  local n = #s
  if n == 0 then return 0 end
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return 0.5 * (s[n / 2] + s[n / 2 + 1])
end
M.median = median

local function summarize(xs)
  local lo, hi, sum = math.huge, -math.huge, 0
  for _, v in ipairs(xs) do
    lo, hi, sum = math.min(lo, v), math.max(hi, v), sum + v
  end
  return { median = median(xs), min = lo, max = hi, mean = #xs > 0 and sum / #xs or 0 }
end

-- Each timed iteration holds two events until the end: a million is far past any useful count.
local MAX_COUNT = 1e6
local function count_opt(name, opts, key, default, least)
  local v = opts[key]
  if v == nil then return default end
  if type(v) ~= "number" or v ~= math.floor(v) or v < least or v > MAX_COUNT then
    raise(name, ("opts.%s must be an integer in [%d, %d], got %s"):format(key, least, MAX_COUNT, capi.show(v)))
  end
  return v
end

-- The options each call takes (_on_start and _on_iter: tp.compare's hooks into time, not documented).
local TIME_OPTIONS = { iters = true, warmup = true, sync = true, collect = true, _on_start = true,
                       _on_iter = true }
local COMPARE_OPTIONS = { iters = true, warmup = true, sync = true, collect = true, check = true, rtol = true,
                          atol = true, quiet = true }

-- values.allgather over the world, its wait named after the call the script made (name: "tp.time" or
-- "tp.compare"), as tp.time's barriers are: a rank whose peers skipped tp.time (a sub-group's members
-- timing its collective alone) is reported blocked in tp.time, not in tp.allgather, a call the script
-- never made.
local function allgather(v, name) return values.allgather(v, nil, name, name) end

-- The ranks must make the same call (the same iterations, the same variants in the same order): the
-- barriers of one rank's iterations would otherwise pair with another's, or wait for ever. what: the
-- call's plan as a string, compared across the world before anything runs (one allgather).
local function agree(name, what, plan)
  local all = allgather(plan, name)
  for r = 2, #all do
    if all[r] ~= all[1] then
      raise(name, ("the ranks passed different %s: rank %d %s, rank 0 %s; every rank must make the same call")
        :format(what, r - 1, all[r], all[1]))
    end
  end
end

-- ==== tp.time =====================================================================================
-- The waits of tp.time go to C under its own name: through the public calls, a failed op of fn (or one
-- left on a stream before) would be reported as "tp.synchronize: ..." or "event:synchronize: ...", calls
-- the script never made.
local function sync_all(name) check(C.tpsh_synchronize(), name) end
local function record(name, e, s) check(C.tpsh_event_record(e, s), name) end
local function sync_event(name, e) check(C.tpsh_event_synchronize(e), name) end
local elapsed_ms = ffi.new("double[1]")
local function elapsed(name, a, b)
  check(C.tpsh_event_elapsed(a, b, elapsed_ms), name)
  return elapsed_ms[0]
end

-- Whether the collector finished a cycle: a sentinel made garbage at each iteration's start counts
-- the cycles that finalise it (or an older one) while fn runs.
local finalized = 0
local sentinel = newproxy(true)
getmetatable(sentinel).__gc = function() finalized = finalized + 1 end

-- Returns { median, min, max, mean (device ms), host (median ms for fn to return), wall (median ms of
-- an iteration including its synchronisation), times (device ms of each iteration), iters, allocs and
-- backend_allocs (tensors fn allocated per timed iteration, and of them blocks the cache did not have),
-- gc_iters (timed iterations in which the collector finished a cycle), gc_steps (steps the allocation
-- pacing took in them) } and, as a second value, what fn returned on its last iteration. opts.collect:
-- a full collection before each iteration (untimed; the default with sync). Hooks for compare:
-- opts._on_start() after the warm-up, opts._on_iter(i, iters) after each iteration.
local function time(name, fn, opts)
  fn = graph.as_function(fn)             -- a graph (tp.graph) is timed by its replays
  if type(fn) ~= "function" then raise(name, "expected a function or a graph, got " .. capi.describe(fn)) end
  opts = opts or {}
  if type(opts) ~= "table" then raise(name, "expected a table of options, got " .. capi.describe(opts)) end
  capi.check_options(name, opts, TIME_OPTIONS)
  local iters = count_opt(name, opts, "iters", 20, 1)
  local warmup = count_opt(name, opts, "warmup", 3, 0)
  local sync = capi.want_flag(name, opts, "sync") ~= false
  -- By default each synchronised iteration starts from a full collection (untimed): the last
  -- iteration's garbage is back in the cache, and no collector cycle is under way, as when a
  -- refcounted runtime has freed it (PyTorch). Back-to-back iterations (sync = false) collect only if
  -- asked.
  local collect = capi.want_flag(name, opts, "collect")
  if collect == nil then collect = sync end
  local multi = C.tpsh_size() > 1
  -- with sync every iteration has a barrier (without it tp.time may run on some ranks only)
  if sync and multi then agree(name, "options", ("{iters = %d, warmup = %d}"):format(iters, warmup)) end
  local s = stream.current_stream()
  local ev = {}
  for i = 1, 2 * iters do ev[i] = stream.new_event { timing = true } end
  for _ = 1, warmup do fn() end
  sync_all(name)
  if opts._on_start then opts._on_start() end
  local host, wall, untimed, last = {}, {}, {}, nil
  local allocs, misses, gc_iters, gc_steps = 0, 0, 0, 0
  for i = 1, iters do
    if collect then collectgarbage(); collectgarbage(); mstats.bytes_since_step = 0 end   -- debt paid
    if sync and multi then
      values.barrier(nil, name)
      -- the collections end at different times on different ranks, and a rank that waited in the
      -- barrier naps (host_exchange.c): it may leave up to a millisecond after the others, and its
      -- time (or its untimed work) would take the difference. A second barrier finds every rank there.
      if collect then values.barrier(nil, name) end
    end
    local _ = newproxy(sentinel)
    local a0, m0, g0, f0 = mstats.allocations, mstats.cache_misses, mstats.gc_steps, finalized
    local h0 = C.tpsh_now_ms()
    record(name, ev[2 * i - 1], s)
    last = fn()
    host[i] = C.tpsh_now_ms() - h0
    allocs, misses = allocs + mstats.allocations - a0, misses + mstats.cache_misses - m0
    gc_steps = gc_steps + mstats.gc_steps - g0
    if finalized > f0 then gc_iters = gc_iters + 1 end
    record(name, ev[2 * i], s)
    if sync then
      -- The end event first, then every stream: what the other streams still ran after the current
      -- one finished is work that fn enqueued and the current stream did not wait for (untimed).
      sync_event(name, ev[2 * i])
      local h1 = C.tpsh_now_ms()
      sync_all(name)
      local h2 = C.tpsh_now_ms()
      wall[i], untimed[i] = h2 - h0, h2 - h1
    end
    if opts._on_iter then opts._on_iter(i, iters) end
  end
  sync_all(name)
  local times = {}
  for i = 1, iters do times[i] = elapsed(name, ev[2 * i - 1], ev[2 * i]) end
  local r = summarize(times)
  r.host, r.times, r.iters = median(host), times, iters
  r.allocs, r.backend_allocs, r.gc_iters, r.gc_steps = allocs / iters, misses / iters, gc_iters, gc_steps
  if sync then r.wall, r.untimed = median(wall), median(untimed) end
  return r, last
end

-- What of the memory's doings may be in a variant's time: new blocks from the backend (the cache had
-- none to reuse yet: a short warm-up, or a loop that keeps more alive each iteration), and collector
-- cycles. nil when neither; allocations from the cache alone are reported, not warned of.
local function memory_note(r)
  local parts = {}
  if r.backend_allocs > 0 then
    parts[#parts + 1] = ("%.3g of the %.3g tensors it allocates an iteration came from the backend, not the "
      .. "cache (more warm-up, or fewer tensors kept alive from one iteration to the next)"):format(
      r.backend_allocs, r.allocs)
  end
  if r.gc_iters > 0 then
    parts[#parts + 1] = ("the garbage collector finished a cycle during %d of %d timed iterations "
      .. "(opts.collect = true collects before each one, as synchronised iterations do by default)"):format(
      r.gc_iters, r.iters)
  end
  if #parts == 0 then return nil end
  return "the timing includes memory management: " .. table.concat(parts, "; ")
end

-- Whether fn left work that the timing does not see: in most iterations the other streams ran on for
-- longer than 0.1 ms and a tenth of the device time after the current stream's end event (the common
-- mistake: an async collective, or work on a side stream, that the current stream never waits for).
local UNTIMED_MS, UNTIMED_SHARE = 0.1, 0.1
local function left_untimed(r)
  return r.untimed and r.untimed > UNTIMED_MS and r.untimed > UNTIMED_SHARE * r.median
end
local function untimed_note(r)
  return ("the function leaves work on other streams that the current stream does not wait for: the "
    .. "device time (median %.3f ms) ends before that work, which ran %.3f ms longer (w:wait() or "
    .. "s:wait_stream(other) inside the function puts it in the timing)"):format(r.median, r.untimed)
end

function M.time(fn, opts)
  local r = time("tp.time", fn, opts)
  if left_untimed(r) then
    io.stderr:write(("[rank %d] tp.time: warning: %s\n"):format(C.tpsh_rank(), untimed_note(r)))
  end
  local mem = memory_note(r)
  if mem then io.stderr:write(("[rank %d] tp.time: warning: %s\n"):format(C.tpsh_rank(), mem)) end
  return r
end

-- ==== tp.compare ==================================================================================
-- { {name, fn}, ... } in order, or { name = fn, ... } in the order of the names.
local function variant_list(variants)
  if type(variants) ~= "table" then
    raise("tp.compare", "expected a list of {name, fn} or a table of name = fn, got " .. capi.describe(variants))
  end
  local list, seen = {}, {}
  local function add(name, fn, where)
    if type(name) ~= "string" then
      raise("tp.compare", ("%s: expected a string name, got %s"):format(where, capi.show(name)))
    end
    if seen[name] then raise("tp.compare", ("two variants are named %q"):format(name)) end
    seen[name] = true
    list[#list + 1] = { name = name, fn = fn }
  end
  local n = #variants
  if n > 0 then
    for k in pairs(variants) do
      if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
        raise("tp.compare", "expected a list of {name, fn} or a table of name = fn, not both")
      end
    end
    for i, v in ipairs(variants) do
      if type(v) ~= "table" or (type(v[2]) ~= "function" and not graph.is_graph(v[2])) then
        raise("tp.compare", ("variant %d: expected {name, fn} (fn a function or a graph), got %s"):format(i,
          capi.describe(v)))
      end
      add(v[1], v[2], "variant " .. i)
    end
  else
    local names = {}
    for k, fn in pairs(variants) do
      if type(k) ~= "string" then
        raise("tp.compare", ("expected a table of name = fn with string names, got the key %s"):format(capi.show(k)))
      end
      if type(fn) ~= "function" and not graph.is_graph(fn) then
        raise("tp.compare", ("variant %s: expected a function or a graph, got %s"):format(k, capi.describe(fn)))
      end
      names[#names + 1] = k
    end
    table.sort(names)
    for _, k in ipairs(names) do add(k, variants[k], "variant " .. k) end
  end
  if #list == 0 then raise("tp.compare", "expected at least one variant") end
  return list
end

local function show_progress()
  return C.tpsh_rank() == 0 and ffi.C.isatty(1) == 1
end

-- This rank's check of output against the first variant's: nil when they agree, else why not.
local function differs(ref, out, rtol, atol)
  if not tensor.is_tensor(out) then return "returned " .. capi.describe(out) .. ", not a tensor" end
  -- (a first variant that returned none raises below, rather than "attempt to index local 'ref'" here)
  if not tensor.is_tensor(ref) then return "not compared: the first variant returned no tensor" end
  -- both named ("shape differs" alone would leave the reader to find which variant made what)
  local same = ref.dtype_id == out.dtype_id and ref.ndim == out.ndim
  for d = 0, ref.ndim - 1 do same = same and ref.sizes[d] == out.sizes[d] end
  if not same then
    return ("returned %s [%s], the first variant %s [%s]"):format(out.dtype, table.concat(out.shape, ", "), ref.dtype,
      table.concat(ref.shape, ", "))
  end
  if tensor.allclose(out, ref, rtol, atol) then return nil end
  return ("max |diff| %.3g"):format(out:max_abs_diff(ref))
end

-- The check column's word for a row: "DIFFERS" only where a tensor was compared and differed; a
-- variant that returned no tensor is "no tensor", one that could not be compared (the first variant
-- returned none) "n/a", rather than DIFFERS for rows that compared nothing.
local function check_word(failed, words)
  if not failed then return nil end
  return words.DIFFERS and "DIFFERS" or words["no tensor"] and "no tensor" or "n/a"
end

local function print_table(rows, traced, checked)
  local head = ("%-22s %12s %10s %10s %10s %8s"):format("variant", "median ms", "min ms", "spread ms", "allocs/it",
    "speedup")
  if traced then head = head .. ("%10s %11s %8s"):format("comm ms", "compute ms", "overlap") end
  if checked then head = head .. "  check" end
  print(head)
  for _, r in ipairs(rows) do
    local line = ("%-22s %12.3f %10.3f %10.3f %10.3g %7.2fx"):format(r.name, r.median, r.min, r.spread, r.allocs,
      r.speedup)
    if traced and r.trace_full then
      line = line .. ("%10s %11s %8s"):format("n/a", "n/a", "n/a")
    elseif traced then
      line = line .. ("%10.3f %11.3f %8.2f"):format(r.comm or 0, r.compute or 0, r.overlap or 0)
    end
    if checked then line = line .. "  " .. (r.check_word or "ok") end
    print(line)
  end
  for _, r in ipairs(rows) do
    if r.trace_full then
      print(("note: %s: the trace was full (tp.trace.clear() makes room), so its comm, compute and overlap "
        .. "are not known"):format(r.name))
    end
    -- one rank's own figures: the row's median and untimed are maxima over ranks, maybe two ranks'
    -- (the note quoted one rank's untimed against another's median, and a slow rank hid another's)
    local worst, at
    for k, x in ipairs(r.ranks) do
      if left_untimed(x) and (not worst or x.untimed > worst.untimed) then worst, at = x, k - 1 end
    end
    if worst then print(("note: %s (rank %d): %s"):format(r.name, at, untimed_note(worst))) end
    -- the rank whose memory did the most (new blocks first, then collector cycles)
    local mem, mem_at, key
    for k, x in ipairs(r.ranks) do
      local score = x.backend_allocs * 1e6 + x.gc_iters
      if memory_note(x) and (not key or score > key) then mem, mem_at, key = x, k - 1, score end
    end
    if mem then print(("note: %s (rank %d): %s"):format(r.name, mem_at, memory_note(mem))) end
  end
  local allocating = {}
  for _, r in ipairs(rows) do if r.allocs > 0 then allocating[#allocating + 1] = r end end
  if #allocating > 0 then
    local names = {}
    for k, r in ipairs(allocating) do names[k] = ("%s (%.3g an iteration)"):format(r.name, r.allocs) end
    print(("note: %s allocate%s tensors in the timed loop: their allocation is part of the time (preallocate "
      .. "outputs to time the schedule alone)"):format(table.concat(names, ", "), #names == 1 and "s" or ""))
  end
end

-- Returns, on every rank, a list (in variant order, also indexed by name) of
-- { name, median (max over ranks of each rank's median), min (over ranks), max, mean, spread (max - min
-- of the ranks' medians), speedup (first's median / this median), host (max over ranks of the median
-- host ms), allocs, backend_allocs, gc_iters (max over ranks: tp.time's), ranks (each rank's tp.time figures), and with tracing comm, compute (ms per iteration,
-- mean over ranks), overlap (mean over ranks) }.
function M.compare(variants, opts)
  local list = variant_list(variants)
  opts = opts or {}
  if type(opts) ~= "table" then raise("tp.compare", "expected a table of options, got " .. capi.describe(opts)) end
  capi.check_options("tp.compare", opts, COMPARE_OPTIONS)
  for _, k in ipairs { "rtol", "atol" } do tensor.tolerance(opts[k], nil, "tp.compare", "opts." .. k) end
  for _, k in ipairs { "sync", "check", "quiet", "collect" } do capi.want_flag("tp.compare", opts, k) end
  if C.tpsh_size() > 1 then
    local names = {}
    for i, v in ipairs(list) do names[i] = ("%q"):format(v.name) end
    agree("tp.compare", "variants", "{" .. table.concat(names, ", ") .. "}")
  end
  local traced = trace.active()
  local progress = show_progress() and not opts.quiet
  local mine, outputs = {}, {}
  for i, v in ipairs(list) do
    values.barrier(nil, "tp.compare")
    -- While tracing, the variant's warm-up and its timed iterations become spans named after it, so
    -- that a timeline says which ops are whose (and which are warm-up).
    local mark, dropped, t_warmup, t_timed = nil, nil, C.tpsh_now_ms(), nil
    local topts = { iters = opts.iters, warmup = opts.warmup, sync = opts.sync, collect = opts.collect,
      _on_start = function()
        C.tpsh_trace_span(v.name .. " (warm-up)", t_warmup)
        t_timed = C.tpsh_now_ms()
        mark, dropped = trace.count(), C.tpsh_trace_dropped()
      end }
    if progress then
      local shown = -math.huge
      topts._on_iter = function(k, n)
        local now = C.tpsh_now_ms()
        if now - shown < 100 and k < n then return end    -- a terminal line, not a stream of writes
        shown = now
        io.stdout:write(("\r  [%d/%d] %-22s %d/%d"):format(i, #list, v.name, k, n))
        io.stdout:flush()
      end
    end
    local r, out = time("tp.compare", v.fn, topts)
    C.tpsh_trace_span(v.name, t_timed)
    r.times = nil
    r.traced = traced or nil
    if traced and C.tpsh_trace_dropped() > dropped then
      r.trace_full = true               -- some of the variant's records are missing: no figures
    elseif traced then
      local st = trace.stats(trace.records(mark, trace.count()))
      r.comm, r.compute, r.overlap = st.comm / r.iters, st.compute / r.iters, st.overlap
    end
    if opts.check then
      -- a copy: variants that write into one shared buffer must not compare a tensor with itself
      outputs[i] = tensor.is_tensor(out) and out:clone() or out
    end
    mine[i] = r
  end
  if progress then io.stdout:write("\r" .. (" "):rep(60) .. "\r"); io.stdout:flush() end
  if opts.check then
    for i = 2, #list do
      mine[i].check_error = differs(outputs[1], outputs[i], opts.rtol or 1e-4, opts.atol or 1e-5)
    end
    if not tensor.is_tensor(outputs[1]) then
      mine[1].check_error = "returned " .. capi.describe(outputs[1]) .. ", not a tensor"
    end
  end
  local all = allgather(mine, "tp.compare")
  -- The trace columns need every rank's figures: tracing started on some ranks only (tp.trace.start is
  -- not collective) leaves them out, with a note, instead of adding up the missing ones (a crash)
  local traced_ranks = 0
  for _, per in ipairs(all) do if per[1] and per[1].traced then traced_ranks = traced_ranks + 1 end end
  local partly = traced_ranks > 0 and traced_ranks < #all
  traced = traced_ranks == #all and #all > 0
  local rows = {}
  for i, v in ipairs(list) do
    local row = { name = v.name, ranks = {}, median = -math.huge, min = math.huge, max = -math.huge, mean = 0,
      host = 0, allocs = 0, backend_allocs = 0, gc_iters = 0 }
    local lo_med, comm, comp, ov, bad, words = math.huge, 0, 0, 0, {}, {}
    for r, per in ipairs(all) do
      local x = per[i]
      row.ranks[r] = x
      row.median = math.max(row.median, x.median)
      lo_med = math.min(lo_med, x.median)
      row.min, row.max = math.min(row.min, x.min), math.max(row.max, x.max)
      row.mean = row.mean + x.mean / #all
      row.host = math.max(row.host, x.host)
      row.allocs = math.max(row.allocs, x.allocs)
      row.backend_allocs = math.max(row.backend_allocs, x.backend_allocs)
      row.gc_iters = math.max(row.gc_iters, x.gc_iters)
      if x.untimed and (row.untimed or -1) < x.untimed then row.untimed, row.untimed_rank = x.untimed, r - 1 end
      if x.trace_full then row.trace_full = true end
      if traced and not row.trace_full then
        comm, comp, ov = comm + x.comm / #all, comp + x.compute / #all, ov + x.overlap / #all
      end
      if x.check_error then
        bad[#bad + 1] = ("rank %d: %s"):format(r - 1, x.check_error)
        words[x.check_error:match("^not compared") and "n/a" or x.check_error:match("^returned ") and "no tensor"
          or "DIFFERS"] = true
      end
    end
    row.spread = row.median - lo_med
    if traced and not row.trace_full then row.comm, row.compute, row.overlap = comm, comp, ov end
    if #bad > 0 then row.check_error = table.concat(bad, "; ") end
    row.check_word = check_word(row.check_error ~= nil, words)
    if opts.check then row.check = row.check_error == nil end
    rows[i] = row
  end
  for _, row in ipairs(rows) do
    row.speedup = row.median > 0 and rows[1].median / row.median or 0
    rows[row.name] = row
  end
  if C.tpsh_rank() == 0 and not opts.quiet then
    print_table(rows, traced, opts.check)
    if partly then
      print(("note: tracing is on on %d of %d ranks (tp.trace.start on some ranks only), so comm, compute and "
        .. "overlap are left out"):format(traced_ranks, #all))
    end
  end
  if opts.check then
    for i, row in ipairs(rows) do
      if row.check_error and i == 1 then
        raise("tp.compare", ("check = true compares the tensors the variants return, and the first, '%s', "
          .. "returns none (%s)"):format(row.name, row.check_error))
      elseif row.check_error then
        raise("tp.compare", ("check failed: variant '%s' does not return the same tensor as '%s' (%s)"):format(
          row.name, rows[1].name, row.check_error))
      end
    end
  end
  return rows
end

function M.install(tp)
  tp.time = M.time
  tp.compare = M.compare
end

return M
