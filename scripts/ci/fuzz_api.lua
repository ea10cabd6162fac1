-- fuzz_api.lua: a randomized review of bad input to tpsh's Lua API (docs/design.md, "Fuzzing the API").
--
--   mpiexec -n 1 tpsh --backend cpu scripts/ci/fuzz_api.lua [--seed S] [--iters K] [--log FILE] [--echo] [--quiet]
--   mpiexec -n N tpsh --backend cpu --timeout 20 scripts/ci/fuzz_api.lua --collectives [--seed S] [--iters K]
--   mpiexec -n N tpsh --backend cpu --timeout 5 scripts/ci/fuzz_api.lua --collectives --mismatch [--seed S]
--   mpiexec -n N tpsh --backend cpu --check scripts/ci/fuzz_api.lua --collectives --mismatch [--seed S]
--   scripts/ci/fuzz_api.sh [build/tpsh] [first seed] [seeds]      many seeds on 1, 2 and 3 ranks
--
-- Single-rank part (the default): K calls of API functions and methods picked at random (docs/api.md:
-- constructors, views, ops, casts, reads, streams, events, tp.with_stream, tp.time, tp.compare, tp.trace,
-- tp.check, Lua-value exchanges, collectives on a group of this rank alone, Works, and the operators),
-- each inside pcall, with arguments drawn from a pool of good and bad values: nil, booleans, edge numbers
-- (0, -1, 2^31, 2^53, 1e308, -0.0, NaN, inf, fractions), strings (empty, dtype names, long, bad UTF-8),
-- tables (nested, with holes, holding themselves, large), tensors of every dtype (0-d, empty,
-- non-contiguous views, freed, a zeroed descriptor), streams, events, groups, Works, functions (one that
-- raises, one that yields, one that makes a random call itself), coroutines and foreign cdata. What a
-- call returns joins the pool, so later calls work on views of views, Works of old streams and so on.
-- A call may raise; the fuzzer checks that the message is a string naming the call (`tp.empty: ...`,
-- `tensor:view: ...`) with no raw FFI or Lua-internal text ("cannot convert", "attempt to", a position
-- inside lua/tpsh/), and for some calls that the result is right (views, clones, casts, fills, tp.from
-- and cat against values computed in Lua), and that no call leaves a current stream or an open batch
-- behind. Each finding is printed with the call; the exit status is 1
-- when there was one. A crash (segfault, abort, LuaJIT panic) ends the process: each call is written to
-- the log (--log; default /tmp/fuzz_api.<seed>.r<rank>.log), flushed, before it is made, so the log's
-- last line names the culprit. Valid but expensive arguments (a 1e7 ms spin, a 16 GiB tensor, a million
-- iterations of tp.time) are replaced by cheap ones before the call, and the log shows what was called.
-- On N > 1 ranks each rank runs its own sequence (drawn from the seed and the rank) and calls nothing
-- collective over the world.
--
-- Multi-rank part (--collectives): every rank draws the same sequence (the same seed), so the calls
-- match: collectives with random dtypes, shapes, ops, roots, options (async, stream, timing), on the
-- world, split groups and new groups, g:batch rings of send/recv, the Lua-value exchanges, waits, and
-- bad arguments that are the same on every rank (each must raise on every rank and leave the group
-- usable). Results are checked against values computed in Lua. With --mismatch one call at a random
-- point is made different on some ranks (a skipped collective, another size, dtype, op, root or kind, an
-- unmatched send, an error on one rank, a skipped host exchange; --mismatch-kind K picks one) and the
-- run must then end on every rank with a non-zero status within the watchdog's timeout, which the driver
-- (fuzz_api.sh) checks. The kinds that nothing can see (outside check mode, an all_reduce of another
-- size or op on one rank, a broadcast from another root)
-- say so on stderr ("may go unnoticed"), and may end with 0.
--
-- The same seed gives the same calls (the fuzzer has its own generator; nothing depends on timing), so
-- a finding reproduces with its seed; tests/fuzz_spec.lua runs a short fixed-seed smoke of each part.
-- Memory errors that do not crash show in a build with -DCMAKE_C_FLAGS="-fsanitize=address,undefined"
-- (and the same in the linker flags), run with ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
-- (the fuzzer asks for allocations larger than ASan's allocator serves, which must fail cleanly) and
-- UBSan's "runtime error" lines looked for in the output, since they do not change the status.
local ffi = require "ffi"

-- ==== options ======================================================================================
local opts = { seed = 1, iters = 2000, log = nil, echo = false, collectives = false, mismatch = false,
  quiet = false }
do
  local i = 1
  while arg and arg[i] do
    local a = arg[i]
    if a == "--seed" or a == "--iters" then
      local v = tonumber(arg[i + 1])
      if not v or v < 0 or v ~= math.floor(v) then error(a .. " expects a non-negative integer", 0) end
      opts[a:sub(3)] = v
      i = i + 1
    elseif a == "--log" then opts.log = arg[i + 1]; i = i + 1
    elseif a == "--echo" then opts.echo = true
    elseif a == "--quiet" then opts.quiet = true
    elseif a == "--collectives" then opts.collectives = true
    elseif a == "--mismatch" then opts.mismatch = true
    elseif a == "--mismatch-kind" then
      opts.mismatch, opts.mismatch_kind = true, tonumber(arg[i + 1])
      if not opts.mismatch_kind or opts.mismatch_kind < 1 or opts.mismatch_kind > 10 then
        error("--mismatch-kind expects 1 to 10", 0)
      end
      i = i + 1
    else error("fuzz_api.lua: unknown argument " .. a .. " (see the header of scripts/ci/fuzz_api.lua)", 0) end
    i = i + 1
  end
end
if opts.mismatch and not opts.collectives then error("--mismatch needs --collectives", 0) end
if opts.mismatch and not tp.check.enabled() and tp.check.timeout() > 60 then
  error("--mismatch leaves ranks waiting on purpose: run it with --check or a short --timeout (<= 60)", 0)
end

-- ==== the generator: xorshift32, the same numbers on every machine ================================
local bxor, lshift, rshift = bit.bxor, bit.lshift, bit.rshift
local state
local function reseed(s)
  state = bit.tobit((s * 2654435761 + 12345) % 4294967296)
  if state == 0 then state = 1 end
  for _ = 1, 8 do
    state = bxor(state, lshift(state, 13)); state = bxor(state, rshift(state, 17)); state = bxor(state, lshift(state, 5))
  end
end
local function rnd()
  local x = state
  x = bxor(x, lshift(x, 13)); x = bxor(x, rshift(x, 17)); x = bxor(x, lshift(x, 5))
  state = x
  return (x % 4294967296) / 4294967296
end
local function rint(n) return math.floor(rnd() * n) + 1 end          -- 1..n
local function chance(p) return rnd() < p end
local function pick(list) return list[rint(#list)] end

-- ==== the log =====================================================================================
local logpath = opts.log and (tp.size > 1 and ("%s.r%d"):format(opts.log, tp.rank) or opts.log)
  or ("/tmp/fuzz_api.%d.r%d.log"):format(opts.seed, tp.rank)
local logf = assert(io.open(logpath, "w"))
local function log(s) logf:write(s, "\n"); logf:flush() end
local function say(s) io.stdout:write(s, "\n"); io.stdout:flush() end
-- --quiet: what the calls print (tp.compare's tables, tp.trace.summary's) is dropped; the summary and
-- the findings are not
local real_print = print
if opts.quiet then print = function() end end

-- ==== describing values (for the log and the findings) ============================================
local scratch        -- the stem of the files that tp.trace.save and svg write (below)
local labels = setmetatable({}, { __mode = "k" })    -- tables, functions, threads, cdata we made
local function label(v, s) labels[v] = s; return v end

local tensor_ct = ffi.typeof("tpsh_tensor")
local is_tensor = tp.is_tensor

local function shape_text(t)
  local s = {}
  for d = 0, t.ndim - 1 do s[#s + 1] = tostring(tonumber(t.sizes[d])) end
  return "[" .. table.concat(s, ",") .. "]"
end

local dtypes = { "f32", "f16", "bf16", "f64", "i32", "i64", "u8" }
local function show(v)
  local ty = type(v)
  if ty == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
    if v == 0 and 1 / v < 0 then return "-0.0" end
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
    return ("%.17g"):format(v)
  elseif ty == "string" then
    if scratch and v:sub(1, #scratch) == scratch then return "<scratch>" .. v:sub(#scratch + 1) end
    if #v > 40 then return ("%q...(%d bytes)"):format(v:sub(1, 20), #v) end
    return (("%q"):format(v):gsub("\n", "n"))
  elseif is_tensor(v) then
    if v.storage == nil then return "tensor{zeroed descriptor}" end
    local flags = ""
    if tp.is_tensor(v) and ffi.C.tpsh_tensor_alive(v) == 0 then flags = flags .. ",freed" end
    if ffi.C.tpsh_tensor_is_contiguous(v) == 0 then flags = flags .. ",nc" end
    return ("T%s%s%s"):format(dtypes[v.dtype_id + 1] or "?", shape_text(v), flags)
  elseif labels[v] then return labels[v]
  elseif tp.is_stream(v) then return ("stream#%d"):format(v.id)
  elseif tp.is_group(v) then return ("group#%d(size %d)"):format(v.id, v.size)
  elseif tp.is_work(v) then return "work"
  elseif tp.is_graph(v) then return "graph"
  elseif ty == "table" then return "table"
  elseif ty == "cdata" then return tostring(ffi.typeof(v))
  end
  return ty
end

local function show_args(a, n)
  local s = {}
  for i = 1, n do s[i] = show(a[i]) end
  return table.concat(s, ", ")
end

-- ==== live objects ================================================================================
local live = { tensor = {}, stream = {}, event = {}, work = {}, group = {}, graph = {} }
local CAP = { tensor = 48, stream = 6, event = 12, work = 16, group = 6, graph = 4 }
local function keep(kind, v)
  local l = live[kind]
  if #l < CAP[kind] then l[#l + 1] = v else l[rint(#l)] = v end
end

local function numel_of(t)
  local n = 1
  for d = 0, t.ndim - 1 do n = n * tonumber(t.sizes[d]) end
  return n
end

-- Keeps what a call returned (tensors of a sane size, streams, events, Works, groups, lists of tensors).
local event_kind = ffi.typeof("tpsh_event *")
local function keep_results(...)
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    if is_tensor(v) then
      if v.storage ~= nil and numel_of(v) <= 2 ^ 16 then keep("tensor", v) end
    elseif tp.is_stream(v) then keep("stream", v)
    elseif ffi.istype(event_kind, v) then keep("event", v)
    elseif tp.is_work(v) then keep("work", v)
    elseif tp.is_group(v) then keep("group", v)
    elseif tp.is_graph(v) then keep("graph", v)
    elseif type(v) == "table" and is_tensor(v[1]) then keep_results(unpack(v, 1, math.min(#v, 4)))
    end
  end
end

-- ==== the pools ===================================================================================
local EDGE_NUMBERS = { 0, -1, 1, 2, 3, 8, 9, 2 ^ 31, 2 ^ 31 - 1, -2 ^ 31, 2 ^ 32, 2 ^ 53, -2 ^ 53, 2 ^ 53 - 1,
  2 ^ 63, 1e308, -1e308, 1e-310, -0.0, 0 / 0, 1 / 0, -1 / 0, 0.5, -2.5, 1.5, 255, 256, 300, 1e5, 65504, 70000 }
local STRINGS = { "", "f32", "f16", "bf16", "f64", "i32", "i64", "u8", "float32", "half", "int", "byte", "F32",
  "sum", "avg", "max", "min", "prod", "high", "low", "normal", "x", "1", "nan", "\0", "\255\254", ("a"):rep(200),
  "tensor", "cpu" }
local OPTION_KEYS = { "async", "stream", "op", "root", "timing", "seed", "name", "priority", "iters", "warmup",
  "sync", "check", "rtol", "atol", "quiet", "width", "title", "bogus", 1, "Async" }

local gen = {}          -- gen[kind]() -> a value of that kind (mostly good, with edge cases)
local depth = 0         -- of nested random calls (functions that make a call themselves)
local random_call       -- defined below

local function any()
  local r = rint(16)
  if r == 1 then return nil
  elseif r == 2 then return rnd() < 0.5
  elseif r <= 5 then return pick(EDGE_NUMBERS)
  elseif r <= 7 then return pick(STRINGS)
  elseif r == 8 then return gen.shape()
  elseif r <= 11 then return gen.tensor()
  elseif r == 12 then return gen.stream()
  elseif r == 13 then return gen.event()
  elseif r == 14 then return pick { gen.group, gen.work, gen.fn }()
  elseif r == 15 then return gen.oddity()
  end
  return gen.opts()
end
gen.any = any

-- Mostly the good pool of a kind, sometimes anything at all.
-- A kind written "!tensor" is always drawn from its pool (the receiver of an operator or a property).
local function draw(kind)
  if kind:sub(1, 1) == "!" then return gen[kind:sub(2)]() end
  if kind == "any" or chance(0.12) then return any() end
  return gen[kind]()
end

function gen.oddity()
  local r = rint(9)
  if r == 1 then return label(coroutine.create(function() end), "coroutine")
  elseif r == 2 then return label(ffi.new("int[3]"), "cdata int[3]")
  elseif r == 3 then return label(ffi.cast("void *", 0), "cdata NULL")
  elseif r == 4 then return label(ffi.new("double", 2), "cdata double 2")
  elseif r == 5 then return 2LL
  elseif r == 6 then return label(setmetatable({}, { __index = function() error("fuzz-boom from __index") end }),
    "table with a raising __index")
  elseif r == 7 then local t = {}; t[1] = t; return label(t, "table holding itself")
  elseif r == 8 then return label(io.stdout, "file")
  end
  return label(print, "function print")
end

function gen.int()
  if chance(0.7) then return rint(5) - 2 end
  return pick(EDGE_NUMBERS)
end
function gen.num()
  if chance(0.6) then return pick { 0, 1, 2, -1, 0.5, 3.25, -7, 100 } end
  return pick(EDGE_NUMBERS)
end
function gen.dim()
  if chance(0.75) then return pick { 1, 2, -1, -2, 1, 3 } end
  return pick { 0, 9, -9, 4, 1.5, 2 ^ 31, 0 / 0, 1 / 0, "1", 2 ^ 53 }
end
function gen.dtype()
  if chance(0.75) then return pick(dtypes) end
  if chance(0.4) then return nil end
  return pick { "float32", "bfloat16", "double", "long", "byte", "int32", "F32", "", "f8", 3, true, {} }
end
function gen.string() return pick(STRINGS) end
function gen.flag() return pick { true, false, nil, true, "yes", 0, 1 } end

local GOOD_SHAPES = { {}, { 0 }, { 1 }, { 3 }, { 2, 3 }, { 3, 2 }, { 4, 4 }, { 2, 0 }, { 0, 3 }, { 1, 2, 3 },
  { 2, 2, 2 }, { 6 }, { 4, 1 }, { 1, 1, 1, 1, 1, 1, 1, 2 } }
function gen.shape()
  local r = rnd()
  if r < 0.6 then
    local s = pick(GOOD_SHAPES)
    local c = {}
    for i = 1, #s do c[i] = s[i] end
    return label(c, "{" .. table.concat(c, ",") .. "}")
  elseif r < 0.7 then return pick { 0, 1, 3, 5, -1, 2.5 }
  end
  local bad = pick {
    function() return { 2, nil, 3 }, "{2,nil,3}" end,
    function() return { n = 3 }, "{n=3}" end,
    function() return { -1 }, "{-1}" end,
    function() return { 2 ^ 53 }, "{2^53}" end,
    function() return { 2 ^ 40, 2 ^ 40 }, "{2^40,2^40}" end,
    function() return { 2 ^ 31, 2 ^ 31, 0 }, "{2^31,2^31,0}" end,
    function() return { 1.5 }, "{1.5}" end,
    function() return { "2" }, "{\"2\"}" end,
    function() return { 0 / 0 }, "{nan}" end,
    function() return { 1 / 0 }, "{inf}" end,
    function() return { 1, 1, 1, 1, 1, 1, 1, 1, 1 }, "{1 x 9}" end,
    function() return { 2, 3, x = 1 }, "{2,3,x=1}" end,
    function() return { {} }, "{{}}" end,
    function() return { 1e308 }, "{1e308}" end,
    function() return { 2, -1 }, "{2,-1}" end,
    function() return { -1, -1 }, "{-1,-1}" end,
    function() return { 2 ^ 32 + 1, 2 ^ 32 - 1, 2 ^ 32 + 1, 2 ^ 32 - 1 }, "{2^32+1,2^32-1,2^32+1,2^32-1}" end,
    function() return { [1] = 2, [3] = 4 }, "{[1]=2,[3]=4}" end,
    function() return { -0.0 }, "{-0.0}" end,
  }
  local t, l = bad()
  return label(t, l)
end

-- Nested data for tp.from.
function gen.nested()
  local r = rint(14)
  if r <= 5 then
    local s = pick(GOOD_SHAPES)
    local function build(d)
      if d > #s then return pick { 0, 1, -1, 2.5, 255, 7, 100, -3 } end
      local t = {}
      for i = 1, s[d] do t[i] = build(d + 1) end
      return t
    end
    return label(build(1), "nested" .. table.concat(s, "x"))
  elseif r == 6 then return pick { 1, 0 / 0, 1e308, -1, 300 }
  elseif r == 7 then return label({ { 1, 2 }, { 3 } }, "ragged {{1,2},{3}}")
  elseif r == 8 then return label({ 1, nil, 3 }, "{1,nil,3}")
  elseif r == 9 then local t = {}; t[1] = t; return label(t, "table holding itself")
  elseif r == 10 then
    local t = 1
    for _ = 1, 10 do t = { t } end
    return label(t, "nested 10 deep")
  elseif r == 11 then
    local t = {}
    for i = 1, 100000 do t[i] = i % 7 end
    return label(t, "{100000 numbers}")
  elseif r == 12 then return label({ 1, "2", 3 }, "{1,\"2\",3}")
  elseif r == 13 then return label({ 0 / 0, 1 / 0, -1 / 0, -0.0, 2 ^ 63, 2 ^ 53 + 1 }, "{nan,inf,-inf,-0.0,2^63,2^53+1}")
  end
  return label({ tp.zeros(2) }, "{tensor}")
end

-- A fresh tensor of a special kind (or one of the pool).
local function fresh_tensor()
  local dt = pick(dtypes)
  local r = rint(12)
  if r == 1 then return tp.zeros(pick(GOOD_SHAPES), dt)
  elseif r == 2 then return tp.arange(12, dt):view({ 3, 4 }):t()                     -- non-contiguous
  elseif r == 3 then return tp.arange(24, dt):view({ 2, 3, 4 }):narrow(3, 2, 2)       -- offset, strided
  elseif r == 4 then return tp.full({}, 2, dt)                                          -- 0-d
  elseif r == 5 then return tp.empty({ 0, 3 }, dt)                                      -- empty
  elseif r == 6 then local t = tp.ones({ 3 }, dt); t:free(); return t                   -- freed
  elseif r == 7 then return tp.arange(6, dt):select(1, 3)                               -- 0-d view
  elseif r == 8 then return tp.rand({ 2, 3 }, pick { "f32", "f64", "f16", "bf16" }, { seed = 5 })
  elseif r == 9 then return tp.arange(16, dt):view({ 4, 4 }):narrow(1, 2, 2):t()
  elseif r == 10 then return tp.ones({ 4 }, dt)
  elseif r == 11 and chance(0.3) then return label(tensor_ct(), "tensor{zeroed descriptor}")
  end
  return tp.from({ { 1, 2 }, { 3, 4 } }, dt)
end

function gen.tensor()
  if #live.tensor > 0 and chance(0.7) then return pick(live.tensor) end
  local t = fresh_tensor()
  if t.storage ~= nil then keep("tensor", t) end
  return t
end
function gen.tensors()
  local r = rint(6)
  local n = rint(4)
  local l = {}
  if r <= 3 then
    local t = gen.tensor()
    for i = 1, n do l[i] = t:is_alive() and chance(0.7) and t:clone() or gen.tensor() end
  elseif r == 4 then return label({}, "{}")
  elseif r == 5 then l = { gen.tensor(), nil, gen.tensor() }
  else for i = 1, n do l[i] = any() end end
  return label(l, "{" .. show_args(l, #l) .. "}")
end

function gen.stream()
  local r = rnd()
  if r < 0.3 then return tp.current_stream() elseif r < 0.4 then return tp.default_stream() end
  if #live.stream > 0 and r < 0.85 then return pick(live.stream) end
  local s = tp.stream { name = "fuzz" .. rint(100), priority = pick { "high", "normal", "low" } }
  keep("stream", s)
  return s
end
function gen.event()
  if #live.event > 0 and chance(0.7) then return pick(live.event) end
  local e = tp.event { timing = chance(0.5) }
  if chance(0.6) then e:record(gen.stream()) end
  keep("event", e)
  return e
end

-- Groups of this rank alone in the single-rank part (every rank's is its own); the world as well on
-- one rank, and in the multi-rank part.
local self_group
-- (In the multi-rank part the random single-rank calls stay off the world too: their groups, made
-- by new_group and split, would differ by rank, and so would the sequence.)
local function world_ok() return tp.size == 1 end
function gen.group()
  if #live.group > 0 and chance(0.5) then return pick(live.group) end
  if world_ok() and chance(0.5) then return tp.world end
  return self_group
end
-- A graph: a kept one, or one that captures an op on a kept tensor (else an empty one, made here).
local empty_graph = tp.graph(function() end)
function gen.graph()
  if #live.graph > 0 and chance(0.7) then return pick(live.graph) end
  local t = #live.tensor > 0 and pick(live.tensor) or nil
  local ok, g = pcall(tp.graph, function() if t then t:mul_(1) end end)
  if not ok then return empty_graph end         -- t freed, or inside a capture already
  keep("graph", g)
  return g
end
function gen.work()
  -- (inside a batch of the group, a random call's drawing must not record a collective in it)
  if #live.work > 0 and (chance(0.8) or self_group._batch) then return pick(live.work) end
  if self_group._batch then return nil end
  local w = self_group:all_reduce(tp.ones({ 2 }), { async = chance(0.5), timing = chance(0.3) })
  keep("work", w)
  return w
end

-- Options tables: mostly valid keys for the call (kinds below), with random values.
local OPTION_VALUES = {
  async = { true, false }, timing = { true, false }, sync = { true, false }, check = { true, false },
  quiet = { true, false }, op = { "sum", "avg", "max", "min", "prod" }, root = { 0 }, seed = { 0, 1, 7, 2 ^ 52 },
  name = { "s", "fuzz stream" }, priority = { "high", "normal", "low" }, iters = { 1, 2, 3 }, warmup = { 0, 1 },
  rtol = { 1e-3, 0 }, atol = { 1e-5, 0 }, width = { 400, 800 }, title = { "t" },
  keepdim = { true, false }, eps = { 1e-5, 0, -1 }, alpha = { 1, 0.5, -2 }, beta = { 0, 1, 2 },
}
local TENSOR_OPTIONS = { out = true, weight = true, bias = true }   -- drawn as tensors, mostly
local function option_table(keys)
  if chance(0.1) then return nil end
  if chance(0.05) then return any() end
  local o, parts = {}, {}
  for _ = 1, rint(3) - 1 do
    local k = chance(0.85) and pick(keys) or pick(OPTION_KEYS)
    local v
    if k == "stream" then v = gen.stream()
    elseif TENSOR_OPTIONS[k] and chance(0.8) then v = gen.tensor()
    elseif OPTION_VALUES[k] and chance(0.8) then v = pick(OPTION_VALUES[k])
    else v = any() end
    o[k] = v
    parts[#parts + 1] = tostring(k) .. "=" .. show(v)
  end
  return label(o, "{" .. table.concat(parts, ", ") .. "}")
end
function gen.opts() return option_table(OPTION_KEYS) end
function gen.copts() return option_table { "async", "stream", "timing" } end
function gen.ropts() return option_table { "op", "async", "stream", "timing" } end
function gen.rootopts()
  if chance(0.3) then return pick { 0, 1, -1, 0.5, 2 ^ 31 } end
  return option_table { "root", "async", "stream", "timing", "op" }
end
function gen.randopts() return option_table { "seed" } end
function gen.sopts() return option_table { "name", "priority" } end
function gen.eopts() return option_table { "timing" } end
function gen.topts() return option_table { "iters", "warmup", "sync" } end
function gen.cmpopts() return option_table { "iters", "warmup", "sync", "check", "rtol", "atol", "quiet" } end
function gen.svgopts() return option_table { "width", "title" } end
function gen.redopts() return option_table { "keepdim", "out" } end          -- ops_reduce.lua
function gen.outopts() return option_table { "out" } end
function gen.gopts() return option_table { "name" } end
function gen.lnopts() return option_table { "weight", "bias", "eps", "out" } end
function gen.rmsopts() return option_table { "weight", "eps", "out" } end
function gen.mmopts() return option_table { "alpha", "beta", "out" } end

-- User functions: their errors pass through the calls that run them, and are not findings.
local USER_ERROR = "fuzz-boom"
function gen.fn()
  local r = rint(7)
  if r == 1 then return label(function() end, "fn()")
  elseif r == 2 then return label(function() error(USER_ERROR .. " from a user function") end, "fn raising")
  elseif r == 3 then return label(function() return tp.ones({ 2 }) end, "fn returning a tensor")
  elseif r == 4 then
    return label(function(...)
      if not coroutine.running() then error(USER_ERROR .. ": would yield outside a coroutine") end
      return coroutine.yield(...)
    end, "fn yielding")
  elseif r == 5 then return label(function() return 1, nil, 3 end, "fn returning 1, nil, 3")
  end
  return label(function(...)
    if depth < 2 then return random_call(...) end
  end, "fn making a random call")
end

function gen.variants()
  local r = rint(5)
  if r <= 2 then
    local l = {}
    for i = 1, rint(3) do l[i] = { "v" .. i, gen.fn() } end
    return label(l, "{{name, fn} x " .. #l .. "}")
  elseif r == 3 then return label({ a = gen.fn(), b = gen.fn() }, "{a = fn, b = fn}")
  elseif r == 4 then return label({ { "x", gen.fn() }, y = gen.fn() }, "{{\"x\", fn}, y = fn}")
  end
  return any()
end

function gen.records()
  local r = rint(4)
  if r == 1 then return nil
  elseif r == 2 then return label({ { 1, 2, "compute" }, { 0, 3, "comm" } }, "{2 records}")
  elseif r == 3 then return label({ { 1, 2 } }, "{bad record}")
  end
  return any()
end

-- Paths for tp.trace.save/svg: files beside a temporary name, or bad ones (never a string of the pool,
-- which would write a file of that name where the fuzzer runs).
scratch = os.tmpname()
os.remove(scratch)
function gen.path()
  local r = rint(8)
  if r <= 3 then return scratch .. pick { ".json", ".svg", "" }
  elseif r == 4 then return "/nonexistent-dir/fuzz.json"
  elseif r == 5 then return "/tmp"
  elseif r == 6 then return ""
  end
  local v = any()
  if type(v) == "string" then return nil end
  return v
end

-- ==== the calls ===================================================================================
-- Each entry: name (as the error message must name it), the kinds of its arguments, the call itself
-- (gets the drawn arguments), and a guard that replaces valid but expensive arguments (returns a reason
-- to log) and a check of the result (returns a complaint). self: a method's receiver kind.
local entries = {}
local function E(name, kinds, call, extra)
  local e = extra or {}
  e.name, e.call = name, call
  e.kinds = {}
  for k in kinds:gmatch("%S+") do e.kinds[#e.kinds + 1] = k end
  entries[#entries + 1] = e
  return e
end

-- Sizes: how many elements a shape argument asks for (nil when it is not a valid shape).
local function shape_numel(s)
  if type(s) == "number" then s = { s } end
  if type(s) ~= "table" then return nil end
  local n = 1
  for i = 1, #s do
    local v = s[i]
    if type(v) ~= "number" or v < 0 or v ~= math.floor(v) or v >= 2 ^ 53 then return nil end
    n = n * v
  end
  return n
end
-- A valid tensor between 16 MiB and 1 TiB would be allocated and written (beyond that, malloc refuses
-- it at once, which is worth trying): replaced by a small one.
local function big(n) return n and n * 8 > 2 ^ 24 and n * 8 < 2 ^ 40 end
local function guard_shape(a, i)
  i = i or 1
  if big(shape_numel(a[i])) then a[i] = { 2 }; return "shape too large to allocate, replaced by {2}" end
end

-- Result checks: values of t as a flat list (nil when they cannot be read: a failed stream).
local function flat(t)
  if not is_tensor(t) or t.storage == nil or not t:is_alive() or t:numel() > 4096 then return nil end
  local ok, v = pcall(t.totable, t)
  if not ok then return nil end
  local out = {}
  local function walk(x) if type(x) == "table" then for i = 1, #x do walk(x[i]) end else out[#out + 1] = x end end
  walk(v)
  return out
end
local function same_value(x, y) return x == y or (x ~= x and y ~= y) end
local function differs(a, b)
  if not a or not b then return nil end
  if #a ~= #b then return ("%d values, expected %d"):format(#a, #b) end
  for i = 1, #a do
    if not same_value(a[i], b[i]) then return ("value %d is %s, expected %s"):format(i, show(a[i]), show(b[i])) end
  end
end
-- t's values in the order of index (a 1-based multi-index), for views checked against their base.
local function at(base_flat, base, idx)
  local k = 0
  local stride = 1
  for d = base.ndim, 1, -1 do
    k = k + (idx[d] - 1) * stride
    stride = stride * tonumber(base.sizes[d - 1])
  end
  return base_flat[k + 1]
end
local function each_index(shape, fn)
  local nd = #shape
  for _, s in ipairs(shape) do if s == 0 then return end end
  local idx = {}
  for d = 1, nd do idx[d] = 1 end
  while true do
    fn(idx)
    local d = nd
    while d >= 1 do
      idx[d] = idx[d] + 1
      if idx[d] <= shape[d] then break end
      idx[d] = 1
      d = d - 1
    end
    if d < 1 then return end
  end
end
-- A view's values against its base (contiguous base only, read before the view was made: base_flat);
-- map(idx) gives the base index of the view's index idx.
local function check_view(view, base, base_flat, map)
  if not base_flat or not base:is_contiguous() then return nil end
  local got = flat(view)
  if not got then return nil end
  local want = {}
  each_index(view.shape, function(idx) want[#want + 1] = at(base_flat, base, map(idx)) end)
  if view:dim() == 0 then want = { at(base_flat, base, map({})) } end
  return differs(got, want)
end

-- ---- tensors: creation ----
local LONG = { float32 = "f32", float = "f32", float16 = "f16", half = "f16", bfloat16 = "bf16", float64 = "f64",
  double = "f64", int32 = "i32", int = "i32", int64 = "i64", long = "i64", uint8 = "u8", byte = "u8" }
for _, d in ipairs(dtypes) do LONG[d] = d end
local function check_new(shape, dtype)
  return function(t)
    if not is_tensor(t) then return "returned " .. show(t) end
    local want = type(shape) == "number" and { shape } or shape
    if type(want) == "table" and #t.shape ~= #want then return "shape " .. shape_text(t) end
    if type(dtype) == "string" and LONG[dtype] and t.dtype ~= LONG[dtype] then
      return "dtype " .. t.dtype .. ", asked for " .. dtype
    end
  end
end
for _, name in ipairs { "empty", "zeros", "ones" } do
  E("tp." .. name, "shape dtype", function(s, d) return tp[name](s, d) end,
    { guard = guard_shape, check = function(r, s, d)
      local c = check_new(s, d)(r)
      if c or name == "empty" then return c end
      local v = flat(r)
      for i = 1, v and #v or 0 do
        if v[i] ~= (name == "ones" and 1 or 0) then return ("value %d is %s"):format(i, show(v[i])) end
      end
    end })
end
E("tp.full", "shape num dtype", function(s, v, d) return tp.full(s, v, d) end, { guard = guard_shape,
  check = function(r, s, v, d)
    local c = check_new(s, d)(r)
    if c then return c end
    local vals = flat(r)
    if not vals or LONG[d] ~= "f64" then return nil end
    for i = 1, #vals do if not same_value(vals[i], v) then return ("value %d is %s, filled %s"):format(i, show(vals[i]), show(v)) end end
  end })
E("tp.arange", "int dtype", function(n, d) return tp.arange(n, d) end, {
  guard = function(a) if big(shape_numel(a[1])) then a[1] = 5; return "count too large, replaced by 5" end end,
  check = function(r, n)
    local v = flat(r)
    if r.dtype ~= "f64" and r.dtype ~= "i64" then return nil end
    for i = 1, v and #v or 0 do if v[i] ~= i - 1 then return ("value %d is %s"):format(i, show(v[i])) end end
  end })
E("tp.rand", "shape dtype randopts", function(s, d, o) return tp.rand(s, d, o) end, { guard = guard_shape,
  check = function(r)
    local v = flat(r)
    for i = 1, v and #v or 0 do if not (v[i] >= 0 and v[i] <= 1) then return ("value %d is %s"):format(i, show(v[i])) end end
  end })
E("tp.randn", "shape dtype randopts", function(s, d, o) return tp.randn(s, d, o) end, { guard = guard_shape })
E("tp.from", "nested dtype", function(x, d) return tp.from(x, d) end, { check = function(r, x, d)
  if d ~= "f64" and d ~= "float64" and d ~= "double" then return nil end
  local want = {}
  local function walk(v) if type(v) == "table" then for i = 1, #v do walk(v[i]) end else want[#want + 1] = v end end
  walk(x)
  return differs(flat(r), want)
end })
E("tp.empty_like", "tensor any", function(t, x) return tp.empty_like(t, x) end, { nargs = 1 })
E("tp.zeros_like", "tensor any", function(t, x) return tp.zeros_like(t, x) end, { nargs = 1 })
E("tp.manual_seed", "int", function(s) return tp.manual_seed(s) end)
E("tp.is_tensor", "any", function(v) return tp.is_tensor(v) end)
E("tp.cat", "tensors dim", function(l, d) return tp.cat(l, d) end, { check = function(r, l, d)
  if not is_tensor(r) or r:dim() ~= 1 or (d ~= nil and d ~= 1 and d ~= -1) then return nil end
  local want = {}
  for i = 1, #l do
    local v = flat(l[i])
    if not v or l[i].dtype ~= r.dtype then return nil end
    for j = 1, #v do want[#want + 1] = v[j] end
  end
  return differs(flat(r), want)
end })
-- Within a relative 1e-9 (BLAS sums in its own order): for f64 results.
local function close(got, want)
  if not got or not want then return nil end
  if #got ~= #want then return ("%d values, expected %d"):format(#got, #want) end
  for i = 1, #got do
    local g, w = got[i], want[i]
    if not same_value(g, w) and not (math.abs(g - w) <= 1e-9 * math.max(1, math.abs(w))) then
      return ("value %d is %s, expected %s"):format(i, show(g), show(w))
    end
  end
end
local function guard_matmul(a)
  local x, y = a[1], a[2]
  if is_tensor(x) and is_tensor(y) and x.ndim == 2 and y.ndim == 2 and
    tonumber(x.sizes[0]) * tonumber(x.sizes[1]) * tonumber(y.sizes[1]) > 1e7 then
    a[1] = tp.ones({ 2, 2 }); return "product too large, replaced a by ones{2,2}"
  end
end
-- r = a @ b of f64 against the product in Lua
local function check_matmul(r, a, b)
  if not (is_tensor(r) and r.dtype == "f64" and a.dtype == "f64" and b.dtype == "f64") then return nil end
  local x, y = flat(a:contiguous()), flat(b:contiguous())
  if not x or not y then return nil end
  local m, k, n = a:size(1), a:size(2), b:size(2)
  local want = {}
  for i = 1, m do
    for j = 1, n do
      local acc = 0
      for l = 1, k do acc = acc + x[(i - 1) * k + l] * y[(l - 1) * n + j] end
      want[#want + 1] = acc
    end
  end
  return close(flat(r), want)
end
E("tp.matmul", "tensor tensor", function(a, b) return tp.matmul(a, b) end, { guard = guard_matmul,
  check = check_matmul })
E("tp.matmul", "tensor tensor tensor", function(a, b, o) return tp.matmul(a, b, o) end, { guard = guard_matmul,
  check = check_matmul })
-- a of the pool times a b made to fit it (two drawn operands rarely fit): 1 to 4 columns, of a's dtype
local function fitting(a, n)
  if not (is_tensor(a) and a.ndim == 2 and a.storage ~= nil) then return a end
  n = (type(n) == "number" and n >= 1 and n <= 4) and math.floor(n) or 3
  return tp.arange(a:size(2) * n, a.dtype):view({ a:size(2), n })
end
E("tp.matmul", "tensor int", function(a, n) return tp.matmul(a, fitting(a, n)) end, {
  check = function(r, a, n) return check_matmul(r, a, fitting(a, n)) end })
-- reductions along a dim, softmax, norms, addmm, bmm (ops_reduce.lua); products kept small by guard_matmul
E("tp.softmax", "tensor dim outopts", function(x, d, o) return tp.softmax(x, d, o) end)
E("tp.log_softmax", "tensor dim outopts", function(x, d, o) return tp.log_softmax(x, d, o) end)
E("tp.layer_norm", "tensor lnopts", function(x, o) return tp.layer_norm(x, o) end)
E("tp.rms_norm", "tensor rmsopts", function(x, o) return tp.rms_norm(x, o) end)
E("tp.addmm", "tensor tensor tensor mmopts", function(c, a, b, o) return tp.addmm(c, a, b, o) end, {
  guard = function(a) local b = { a[2], a[3] }; local why = guard_matmul(b); a[2] = b[1]; return why end })
E("tp.addmm", "tensor tensor int mmopts", function(c, a, n, o) return tp.addmm(c, a, fitting(a, n), o) end)
E("tp.bmm", "tensor tensor", function(a, b) return tp.bmm(a, b) end)
E("tp.spin", "num", function(ms) return tp.spin(ms) end, {
  guard = function(a) if type(a[1]) == "number" and a[1] > 2 and a[1] <= 1e7 then a[1] = 1; return "long spin replaced by 1 ms" end end })
E("tp.allclose", "tensor tensor num num", function(a, b, r, t) return tp.allclose(a, b, r, t) end, { nargs = 2 })
E("tp.equal", "tensor tensor", function(a, b) return tp.equal(a, b) end)
E("tp.now", "", function() return tp.now() end)

-- ---- tensors: methods ----
-- The entries of a kind's methods: methods_of("tensor")("view", "shape") calls t:view(shape), with the
-- method of the kind's sample object (below), so that self is drawn like any argument.
local function methods_of(kind)
  return function(name, kinds, extra)
    local e = E(kind .. ":" .. name, kind .. " " .. kinds, nil, extra)
    e.method, e.sample = name, kind
    return e
  end
end
local M = methods_of("tensor")
for _, m in ipairs { "dim", "numel", "nbytes", "is_contiguous", "is_alive", "contiguous", "t", "free", "item",
  "data_ptr", "storage_id" } do
  M(m, "")
end
M("sum", "", { check = function(r, t)
  if not (is_tensor(r) and r.dtype == "f64") then return nil end
  local v = flat(t)
  if not v then return nil end
  local acc = 0
  for i = 1, #v do acc = acc + v[i] end
  return close(flat(r), { acc })
end })
M("size", "dim", { nargs = 1 })
M("stride", "dim", { nargs = 1 })
M("clone", "", { check = function(r, t)
  if is_tensor(r) and t.storage ~= nil and t:is_alive() then return differs(flat(r), flat(t)) end
end })
M("view", "shape", { pre = function(t) return flat(t) end, check = function(r, t, _, base)
  if is_tensor(r) and t:is_contiguous() then return differs(flat(r), base) end
end })
M("narrow", "dim int int", { pre = function(t) return flat(t) end, check = function(r, t, d, s, _, base)
  if not is_tensor(r) then return nil end
  local dd = d < 0 and t:dim() + d + 1 or d
  return check_view(r, t, base, function(idx)
    local b = {}
    for i = 1, t:dim() do b[i] = idx[i] end
    b[dd] = b[dd] + s - 1
    return b
  end)
end })
M("select", "dim int", { pre = function(t) return flat(t) end, check = function(r, t, d, i, base)
  if not is_tensor(r) then return nil end
  local dd = d < 0 and t:dim() + d + 1 or d
  local ii = i < 0 and t:size(dd) + i + 1 or i
  return check_view(r, t, base, function(idx)
    local b = {}
    for k = 1, t:dim() - 1 do b[k < dd and k or k + 1] = idx[k] end
    b[dd] = ii
    return b
  end)
end })
M("transpose", "dim dim", { pre = function(t) return flat(t) end, check = function(r, t, d1, d2, base)
  if not is_tensor(r) then return nil end
  local a = (d1 or 1) < 0 and t:dim() + d1 + 1 or (d1 or 1)
  local b = (d2 or 2) < 0 and t:dim() + d2 + 1 or (d2 or 2)
  return check_view(r, t, base, function(idx)
    local m = {}
    for k = 1, t:dim() do m[k] = idx[k] end
    m[a], m[b] = idx[b], idx[a]
    return m
  end)
end })
M("chunk", "int dim", { nargs = 1, guard = function(a)
  if type(a[2]) == "number" and a[2] > 64 and a[2] < 2 ^ 53 then a[2] = 64; return "many chunks replaced by 64" end
end })
M("copy_", "tensor", { check = function(r, t, src)
  if r == t and is_tensor(src) and src.dtype == t.dtype and t.storage ~= nil and t:storage_id() ~= src:storage_id() then
    return differs(flat(t), flat(src))
  end
end })
M("fill_", "num")
M("add_", "tensor num", { nargs = 1 })
M("add_", "num num", { nargs = 1 })
M("mul_", "tensor")
M("mul_", "num")
-- element-wise ops (ops_pointwise.lua): functions with an options table drawn as anything, methods,
-- in-place forms
for _, n in ipairs { "relu", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs", "neg" } do
  E("tp." .. n, "tensor any", function(x, o) return tp[n](x, o) end, { nargs = 1 })
  M(n, "")
  M(n .. "_", "")
end
for _, n in ipairs { "add", "sub", "mul", "div", "maximum", "minimum", "gelu_backward" } do
  E("tp." .. n, "tensor tensor any", function(a, b, o) return tp[n](a, b, o) end, { nargs = 2 })
end
E("tp.pow", "tensor num any", function(x, p, o) return tp.pow(x, p, o) end, { nargs = 2 })
M("pow", "num")
M("pow_", "num")
M("sub_", "tensor num", { nargs = 1 })
M("div_", "tensor")
M("div_", "num")
M("maximum", "tensor")
M("expand", "shape")
M("to", "dtype", { check = function(r, t, d)
  if not is_tensor(r) or t.storage == nil or not t:is_alive() then return nil end
  -- casts between integer dtypes of small values and to f64 keep the values
  if r.dtype == "f64" and t.dtype ~= "f64" then return differs(flat(r), flat(t)) end
end })
M("matmul", "tensor", { also = "tp.matmul" })    -- t:matmul is tp.matmul, and says so
for _, m in ipairs { "sum", "mean", "amax", "amin", "max", "min" } do M(m, "dim redopts") end
M("softmax", "dim outopts")
M("log_softmax", "dim outopts")
M("addmm_", "tensor tensor mmopts", { guard = function(a)
  local b = { a[2], a[3] }; local why = guard_matmul(b); a[2] = b[1]; return why end })
M("bmm", "tensor")
M("totable", "", { guard = function(a) if is_tensor(a[1]) and a[1].storage ~= nil and numel_of(a[1]) > 2 ^ 16 then
  a[1] = tp.ones({ 2 }); return "large totable replaced" end end })
M("max_abs_diff", "tensor")
M("record_stream", "stream")
-- properties, the length, tostring, a new field, the operators
E("tensor.shape", "!tensor", function(t) return t.shape, t.dtype, t.device_name end)
E("tensor #", "!tensor", function(t) return #t end)
E("tostring", "!tensor", function(t) return tostring(t) end)
E("tensor", "!tensor any", function(t, v) t.foo = v end)
E("tensor", "!tensor any", function(t, v) t.sizes[0] = 1 end, { allow = "constant" })
-- (a list, not a table by operator: pairs' order differs between processes, and so would the sequence)
for _, p in ipairs { { "+", function(a, b) return a + b end }, { "-", function(a, b) return a - b end },
  { "*", function(a, b) return a * b end }, { "/", function(a, b) return a / b end } } do
  local op, fn = p[1], p[2]
  E("tensor " .. op, "!tensor any", function(a, b) return fn(a, b) end)
  E("tensor " .. op, "num !tensor", function(a, b) return fn(a, b) end)
  E("tensor " .. op, "!tensor tensor", function(a, b) return fn(a, b) end)
end
E("tensor -", "!tensor", function(a) return -a end)
E("tensor ^", "!tensor any", function(a, p) return a ^ p end)

-- ---- streams and events ----
E("tp.stream", "sopts", function(o) return tp.stream(o) end)
E("tp.current_stream", "", function() return tp.current_stream() end)
E("tp.default_stream", "", function() return tp.default_stream() end)
E("tp.with_stream", "stream fn any", function(s, f, x) return tp.with_stream(s, f, x) end, { nargs = 2 })
E("tp.synchronize", "", function() return tp.synchronize() end)
E("tp.is_stream", "any", function(v) return tp.is_stream(v) end)
E("tp.event", "eopts", function(o) return tp.event(o) end)
local SM = methods_of("stream")
for _, m in ipairs { "synchronize", "query", "handle" } do SM(m, "") end
SM("wait_event", "event")
SM("wait_stream", "stream")
E("stream", "!stream", function(s) return s.name, s.priority, s.id, tostring(s) end)
local EM = methods_of("event")
EM("record", "stream", { nargs = 0 })
EM("wait", "stream", { nargs = 0 })
EM("query", "")
EM("synchronize", "")
EM("elapsed", "event")

-- ---- graphs: a capture of a function (its random calls are refused or recorded), and replays ----
E("tp.graph", "fn gopts", function(f, o) return tp.graph(f, o) end)
E("tp.is_graph", "any", function(v) return tp.is_graph(v) end)
E("tp.is_capturing", "", function() return tp.is_capturing() end)
local GRM = methods_of("graph")
GRM("replay", "stream", { nargs = 0 })
GRM("free", "")
GRM("stats", "")
E("graph", "!graph", function(g) return g.name, tostring(g) end)

-- ---- groups, collectives and Works (a group of this rank alone, or the world on one rank) ----
local GM = methods_of("group")
GM("all_reduce", "tensor ropts", { nargs = 1 })
GM("all_gather", "tensor tensor copts", { nargs = 2 })
GM("all_gather", "tensors tensor copts", { nargs = 2 })
GM("reduce_scatter", "tensor tensor ropts", { nargs = 2 })
GM("broadcast", "tensor rootopts", { nargs = 1 })
GM("reduce", "tensor rootopts", { nargs = 1 })
GM("all_to_all", "tensor tensor copts", { nargs = 2 })
GM("send", "tensor int copts", { nargs = 2 })
GM("recv", "tensor int copts", { nargs = 2 })
GM("batch", "fn copts", { nargs = 1 })
GM("seq", "")
GM("handle", "")
GM("comm_stream", "")
GM("barrier", "")
GM("allgather", "any")
GM("gather", "any int", { nargs = 1 })
GM("bcast", "any int", { nargs = 1 })
GM("split", "int int", { nargs = 1, check = function(r, g, color)
  if r ~= nil and not tp.is_group(r) then return "returned " .. show(r) end
end })
E("group", "!group", function(g) return g.rank, g.size, g.ranks, g.id, tostring(g) end)
-- a ring of one: a send to oneself and its receive in one batch (the fuzzer's own valid use)
E("group:batch", "group tensor", function(g, t)
  if not tp.is_group(g) or g.size ~= 1 or not is_tensor(t) then return nil end
  local made, r = pcall(tp.empty_like, t)      -- (the fuzzer's own helper: its errors are not the call's)
  if not made then return nil end
  return g:batch(function() g:send(t, 0); g:recv(r, 0) end)
end, { also = "group:" })       -- the send or the recv names itself
E("tp.is_group", "any", function(v) return tp.is_group(v) end)
E("tp.is_work", "any", function(v) return tp.is_work(v) end)
local WM = methods_of("work")
WM("wait", "stream", { nargs = 0 })
WM("block", "")
WM("is_completed", "")
WM("elapsed", "")
E("work", "!work", function(w) return w.stream, w.name, tostring(w) end)

-- Calls over the world: on one rank, or in the multi-rank part (where every rank makes them).
local WORLD = {}
-- tp.time's and tp.compare's options: valid but long iteration counts (4 to a million) cut to 3; says
-- which, or nil.
local function few_iters(o)
  for _, k in ipairs { "iters", "warmup" } do
    if type(o[k]) == "number" and o[k] > 3 and o[k] <= 1e6 then o[k] = 3; return k .. " replaced by 3" end
  end
end

for _, e in ipairs {
  E("tp.allgather", "any", function(v) return tp.allgather(v) end),
  E("tp.gather", "any int", function(v, r) return tp.gather(v, r) end, { nargs = 1 }),
  E("tp.bcast", "any int", function(v, r) return tp.bcast(v, r) end, { nargs = 1 }),
  E("tp.barrier", "", function() return tp.barrier() end),
  E("tp.new_group", "any", function(l) return tp.new_group(l) end),
  E("tp.new_group", "int", function(r) return tp.new_group({ 0, r }) end),
  E("tp.time", "fn topts", function(f, o) return tp.time(f, o) end, { guard = function(a)
    if type(a[2]) == "table" then return few_iters(a[2]) end
  end }),
  E("tp.compare", "variants cmpopts", function(v, o) return tp.compare(v, o) end, { guard = function(a)
    local o = a[2]
    if type(o) == "table" then
      local why = few_iters(o)
      if why then return why end
      if o.quiet == nil then o.quiet = true end
    end
  end }),
  E("tp.trace.save", "!path", function(p) return tp.trace.save(p) end),
  E("tp.trace.svg", "!path svgopts", function(p, o) return tp.trace.svg(p, o) end),
  E("tp.trace.summary", "opts", function(o) return tp.trace.summary(o) end, { guard = function(a)
    if type(a[1]) == "table" and a[1].quiet == nil then a[1].quiet = true end
  end }),
} do WORLD[e] = true end

-- ---- the trace and check mode (this rank's own) ----
E("tp.trace.start", "", function() return tp.trace.start() end)
E("tp.trace.stop", "", function() return tp.trace.stop() end)
E("tp.trace.clear", "", function() return tp.trace.clear() end)
E("tp.trace.active", "", function() return tp.trace.active() end)
E("tp.trace.count", "", function() return tp.trace.count() end)
E("tp.trace.records", "int int", function(a, b) return tp.trace.records(a, b) end, { nargs = 0 })
E("tp.trace.stats", "records", function(r) return tp.trace.stats(r) end)
E("tp.trace.span", "string fn any", function(n, f, x) return tp.trace.span(n, f, x) end, { nargs = 2 })
E("tp.range", "string fn any", function(n, f, x) return tp.range(n, f, x) end, { nargs = 2 })
E("tp.range_push", "string", function(n) return tp.range_push(n) end)
E("tp.range_pop", "string", function(n) return tp.range_pop(n) end, { nargs = 0 })
E("tp.chaos", "int fn any", function(s, f, x) return tp.chaos(s, f, x) end, { nargs = 1, guard = function(a)
  -- chaos left on would delay every later call by milliseconds; inside a function it ends with it
  if type(a[1]) == "number" and a[1] >= 1 and a[1] < 2 ^ 53 and a[1] == math.floor(a[1]) and type(a[2]) ~= "function" then
    a[1] = false
    return "a valid seed without a function dropped"
  end
end })
E("tp.check.enable", "flag", function(on) return tp.check.enable(on) end)
E("tp.check.strict", "flag", function(on) return tp.check.strict(on) end)
E("tp.check.reports", "", function() return tp.check.reports() end)
E("tp.check.clear", "", function() return tp.check.clear() end)
E("tp.check.flight_record", "", function() return tp.check.flight_record() end)
E("tp.check.timeout", "num", function(s) return tp.check.timeout(s) end, { nargs = 0, guard = function(a)
  -- a short timeout would end the run where a host wait is slow; the bad values are what is tried here
  if type(a[1]) == "number" and a[1] > 0 and a[1] < 1e6 then a[1] = nil; return "valid timeout dropped" end
end })
-- in a coroutine: a function given to a call may yield there
E("coroutine", "", function()
  local co = coroutine.create(function() return random_call() end)
  local was = depth                   -- a call suspended by a yield never comes back to count itself out
  local ok, err = coroutine.resume(co)
  depth = was
  if not ok then error(err, 0) end
end)

-- Samples whose methods the entries call (a method called on anything: self is drawn, not assumed).
local samples
local function method_of(e)
  local s = samples[e.sample]
  return s[e.method]
end

-- ==== judging an error ============================================================================
local findings = {}
local function finding(kind, desc, detail)
  findings[#findings + 1] = ("%s: %s\n    %s"):format(kind, desc, detail)
  log("FINDING " .. kind .. ": " .. detail)
  io.stderr:write(("[rank %d] fuzz_api FINDING (%s) seed %d: %s\n    %s\n"):format(tp.rank, kind, opts.seed, desc,
    detail))
end

local RAW = { "cannot convert", "attempt to ", "bad argument", "/lua/tpsh/", "(null)", "table index is nil",
  "stack overflow", "C stack overflow", "invalid key to 'next'" }
local function judge(e, desc, err)
  if type(err) ~= "string" then
    return finding("unclear error", desc, "error object " .. show(err) .. " is not a message")
  end
  if err:find(USER_ERROR, 1, true) then return end                 -- a user function's own error
  if e.allow and err:find(e.allow, 1, true) then return end
  for _, raw in ipairs(RAW) do
    if err:find(raw, 1, true) then return finding("unclear error", desc, err) end
  end
  if not err:find(e.name, 1, true) and not (e.also and err:find(e.also, 1, true)) then return finding("unclear error", desc, "does not name the call: " .. err) end
end

-- ==== making a call ===============================================================================
local ncalls, nerrors = 0, 0
local leaked_stream, leaked_batch, leaked_capture = false, false, false

function random_call(...)
  depth = depth + 1
  local e
  repeat e = pick(entries) until not (WORLD[e] and not world_ok())
    and not (depth > 1 and (e.name == "coroutine" or WORLD[e]))
  ncalls = ncalls + 1
  local id = ("#%d%s"):format(ncalls, depth > 1 and (" (nested, depth " .. depth .. ")") or "")
  log(id .. " drawing arguments for " .. e.name)
  local a = {}
  local n = #e.kinds
  for i = 1, n do
    -- (drawing makes tensors, views and Works: in strict check mode, inside a batch or a graph's
    -- capture, that may raise)
    local ok, v = pcall(draw, e.kinds[i])
    if ok then a[i] = v else log(id .. " drawing raised: " .. tostring(v)) end
    if not ok and e.kinds[i]:sub(1, 1) == "!" then        -- a receiver it could not make: no call
      depth = depth - 1
      return nil
    end
  end
  -- fewer arguments (down to the required ones), or one more
  if e.nargs and chance(0.3) then
    n = e.nargs + rint(n - e.nargs + 1) - 1
    for i = n + 1, #e.kinds do a[i] = nil end
  end
  if chance(0.05) then n = n + 1; a[n] = any() end
  local why
  if e.guard then
    local ok, w = pcall(e.guard, a)            -- (a table with a raising __index may be among a)
    why = ok and w or nil
  end
  local desc = ("%s(%s)"):format(e.name, show_args(a, n))
  if why then desc = desc .. " [" .. why .. "]" end
  log(id .. " " .. desc)
  if opts.echo then say(id .. " " .. desc) end
  local pre = e.pre and is_tensor(a[1]) and a[1].storage ~= nil and a[1]:is_alive() and e.pre(a[1]) or nil
  local fn = e.call or method_of(e)
  local res = { pcall(fn, unpack(a, 1, n)) }
  if not res[1] then
    nerrors = nerrors + 1
    log(id .. " -> error: " .. tostring(res[2]))
    judge(e, desc, res[2])
  else
    log(id .. " -> ok")
    keep_results(unpack(res, 2, table.maxn(res)))
    -- results are checked when the call got exactly its arguments
    if e.check and n == #e.kinds then
      a[n + 1] = pre
      local ok, complaint = pcall(e.check, res[2], unpack(a, 1, n + 1))
      if not ok then finding("check raised", desc, tostring(complaint))
      elseif complaint then finding("wrong result", desc, complaint) end
    end
  end
  depth = depth - 1
  if depth == 0 then
    -- nothing a call does may outlive it: the current stream is back, no batch is left open
    if tp.current_stream().id ~= tp.default_stream().id and not leaked_stream then
      leaked_stream = true
      finding("state left behind", desc, "the current stream is " .. show(tp.current_stream()) .. " after the call")
    end
    if tp.is_capturing() and not leaked_capture then
      leaked_capture = true
      finding("state left behind", desc, "a graph's capture is left open after the call")
    end
    for _, g in ipairs { self_group, tp.world } do
      if g._batch and not leaked_batch then
        leaked_batch = true
        finding("state left behind", desc, "a batch is left open on " .. show(g))
      end
    end
  end
  if not res[1] then return nil end
  return unpack(res, 2, table.maxn(res))
end

-- ==== the multi-rank part =========================================================================
-- Every rank draws the same numbers; what differs by rank is computed from the rank (consistently).
local function flat_of(t)
  local out = {}
  local function walk(x) if type(x) == "table" then for i = 1, #x do walk(x[i]) end else out[#out + 1] = x end end
  walk(t:totable())
  return out
end
local FLOAT = { f32 = true, f64 = true, f16 = true, bf16 = true }
local CDTYPES = { "f32", "f64", "i32", "i64", "f16", "bf16", "u8" }

-- The groups of the steps: at the same index on every rank, each rank's own where they differ (the
-- parity split: ranks 0, 2 in one group, 1 in another, each doing the same call on its own group).
local groups
local function coll_group() return pick(groups) end

-- Values v(rank, k) small enough to be exact in every dtype (u8 takes no sum or prod below); what a
-- reduction gives is computed exactly and cast once, as f16 and bf16 reduce in f32 and round once.
local function val(rank, k) return (rank + 1) * 2 + (k % 3) end
local function make(shape, dtype, rank)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  local host = {}
  for k = 1, n do host[k] = val(rank, k) end
  local t = tp.from(#host > 0 and host or {}, "f64"):to(dtype)
  return #shape > 0 and t:view(shape) or t:view({}), host
end

local function reduce_vals(op, dtype, g, k)
  local acc
  for q = 0, g.size - 1 do
    local v = val(q, k)
    if acc == nil then acc = v
    elseif op == "sum" or op == "avg" then acc = acc + v
    elseif op == "max" then acc = math.max(acc, v)
    elseif op == "min" then acc = math.min(acc, v)
    elseif op == "prod" then acc = acc * v end
  end
  if op == "avg" then acc = FLOAT[dtype] and acc / g.size or math.floor(acc / g.size) end
  return tp.from({ acc }, "f64"):to(dtype):item()
end

local coll_checks, coll_runs, coll_refused = 0, 0, 0
local function expect(desc, got, want)
  coll_checks = coll_checks + 1
  local d = differs(got, want)
  if d then finding("wrong result", desc, d) end
end


-- One random collective step; returns nothing. Bad arguments are the same on every rank.
local function collective_step(i)
  local g = coll_group()
  local id = ("#%d"):format(i)
  local dtype = pick(CDTYPES)
  local rows = rint(3) - 1                      -- 0..2
  local cols = pick { 1, 2, 3 }
  local shape = { rows, cols }
  local r = rint(14)
  local async = chance(0.3)
  local copts = { async = async or nil, timing = chance(0.2) or nil }
  if chance(0.15) then copts.stream = gen.stream() end
  local bad = chance(0.15) and rint(6) or nil      -- a bad argument of the same kind on every rank
  local function run(desc, f, check, name)
    log(("%s %s%s"):format(id, desc, bad and (" [bad " .. bad .. "]") or ""))
    coll_runs = coll_runs + 1
    -- drawn before the call: whether it raises may differ by rank (a bad argument that is not one on
    -- a group of one), and the ranks must draw the same numbers whatever happens
    local how = rint(3)
    local ok, w = pcall(f)
    if not ok then
      if bad then coll_refused = coll_refused + 1 end
      log(id .. " -> error: " .. tostring(w))
      if not bad then finding("unexpected error", desc, tostring(w))
      else judge({ name = name or desc:match("^([^(]+)%(") or desc }, desc, w) end
      return
    end
    if bad then finding("bad argument accepted", desc, "bad " .. bad .. " raised nothing") end
    if tp.is_work(w) then
      if how == 1 then w:wait() elseif how == 2 then w:block() else while not w:is_completed() do end; w:wait() end
    end
    if check then check() end
    log(id .. " -> ok")
  end
  local function n_of(s) local n = 1; for _, v in ipairs(s) do n = n * v end; return n end
  if r <= 3 then
    local op = pick { "sum", "avg", "max", "min", "prod" }
    if (op == "prod" or op == "sum") and dtype == "u8" then op = "max" end
    local t, host = make(shape, dtype, g.rank)
    local o = { op = op, async = copts.async, stream = copts.stream, timing = copts.timing }
    if bad == 1 then o.op = "mean" elseif bad == 2 then t:free() elseif bad == 3 then o.bogus = true
    elseif bad == 4 and n_of(shape) > 1 then t = t:view({ n_of(shape) }):view(#shape == 2 and { shape[1], shape[2] } or { n_of(shape) }):t()
      if t:is_contiguous() then bad = nil end
    elseif bad == 5 then o.async = "yes" elseif bad then bad = nil end
    run(("group:all_reduce(T%s{%s}, op=%s)"):format(dtype, table.concat(shape, ","), op), function()
      return g:all_reduce(t, o)
    end, function()
      local want = {}
      for k = 1, #host do want[k] = reduce_vals(op, dtype, g, k) end
      expect(id .. " all_reduce", flat_of(t), want)
    end)
  elseif r == 4 then
    local x, host = make(shape, dtype, g.rank)
    local oshape = { shape[1] * g.size, shape[2] }
    local out = tp.zeros(oshape, dtype)
    local list = chance(0.4)
    if bad == 1 then out = tp.zeros({ shape[1] * g.size + 1, shape[2] }, dtype)
    elseif bad == 2 then out = tp.zeros(oshape, dtype == "f32" and "f64" or "f32")
    elseif bad then bad = nil end
    local target = out
    if list and not bad and shape[1] > 0 then target = out:chunk(g.size, 1) end
    run(("group:all_gather(T%s{%s}, list=%s)"):format(dtype, table.concat(shape, ","), tostring(list)), function()
      return g:all_gather(target, x, copts)
    end, function()
      local want = {}
      for q = 0, g.size - 1 do for k = 1, #host do want[#want + 1] = val(q, k) end end
      expect(id .. " all_gather", flat_of(out), want)
    end)
  elseif r == 5 then
    local op = pick { "sum", "max", "min" }
    local oshape = { shape[1], shape[2] }
    local xshape = { shape[1] * g.size, shape[2] }
    local x, host = make(xshape, dtype, g.rank)
    local out = tp.zeros(oshape, dtype)
    if bad == 1 then out = tp.zeros({ shape[1] + 1, shape[2] }, dtype) elseif bad then bad = nil end
    run(("group:reduce_scatter(T%s{%s}, op=%s)"):format(dtype, table.concat(xshape, ","), op), function()
      return g:reduce_scatter(out, x, { op = op, async = copts.async, stream = copts.stream })
    end, function()
      local want, per = {}, #host / g.size
      for k = 1, per do want[k] = reduce_vals(op, dtype, g, g.rank * per + k) end
      expect(id .. " reduce_scatter", flat_of(out), want)
    end)
  elseif r == 6 or r == 7 then
    local root = rint(g.size) - 1
    local t, host = make(shape, dtype, g.rank)
    local o = { root = root, async = copts.async }
    if bad == 1 then o.root = g.size elseif bad == 2 then o.root = -1 elseif bad == 3 then o.root = 0.5
    elseif bad == 4 then o.root = 2 ^ 32 elseif bad then bad = nil end
    if r == 6 then
      run(("group:broadcast(T%s{%s}, root=%s)"):format(dtype, table.concat(shape, ","), show(o.root)), function()
        return g:broadcast(t, o)
      end, function()
        local want = {}
        for k = 1, #host do want[k] = val(root, k) end
        expect(id .. " broadcast", flat_of(t), want)
      end)
    else
      o.op = "max"
      run(("group:reduce(T%s{%s}, root=%s)"):format(dtype, table.concat(shape, ","), show(o.root)), function()
        return g:reduce(t, o)
      end, function()
        if g.rank ~= root then return end
        local want = {}
        for k = 1, #host do want[k] = reduce_vals("max", dtype, g, k) end
        expect(id .. " reduce", flat_of(t), want)
      end)
    end
  elseif r == 8 then
    local xshape = { shape[1] * g.size, shape[2] }
    local x, host = make(xshape, dtype, g.rank)
    local out = tp.zeros(xshape, dtype)
    if bad == 1 then out = tp.zeros({ shape[1] * g.size, shape[2] + 1 }, dtype) elseif bad then bad = nil end
    run(("group:all_to_all(T%s{%s})"):format(dtype, table.concat(xshape, ",")), function()
      return g:all_to_all(out, x, copts)
    end, function()
      local want, per = {}, #host / g.size
      for q = 0, g.size - 1 do for k = 1, per do want[#want + 1] = val(q, g.rank * per + k) end end
      expect(id .. " all_to_all", flat_of(out), want)
    end)
  elseif r == 9 then
    -- a ring: send to the next rank, receive from the previous one, in one batch
    local x, host = make(shape, dtype, g.rank)
    local y = tp.zeros(shape, dtype)
    local nxt, prv = (g.rank + 1) % g.size, (g.rank - 1) % g.size
    if bad == 1 then nxt = g.size elseif bad == 2 then y = x elseif bad then bad = nil end
    if bad == 2 and (n_of(shape) == 0 or g.size == 1) then bad = nil; y = tp.zeros(shape, dtype) end
    run(("group:batch(ring of send/recv, T%s{%s})"):format(dtype, table.concat(shape, ",")), function()
      return g:batch(function() g:send(x, nxt); g:recv(y, prv) end, { async = copts.async })
    end, function()
      local want = {}
      for k = 1, #host do want[k] = val(prv, k) end
      expect(id .. " ring", flat_of(y), want)
    end, "group:")
  elseif r == 10 then
    local v = pick { 1, "s", { 1, { 2 } }, true, 0 / 0 }
    local kind = rint(4)
    local root = rint(g.size) - 1
    if bad == 1 and kind ~= 1 then root = g.size elseif bad == 2 then v = print elseif bad then bad = nil end
    if kind == 1 then
      run("group:allgather(" .. show(v) .. ")", function() return g:allgather(v) end)
    elseif kind == 2 then
      run("group:gather(" .. show(v) .. ", " .. root .. ")", function() return g:gather(v, root) end)
    elseif kind == 3 then
      run("group:bcast(" .. show(v) .. ", " .. root .. ")", function() return g:bcast(v, root) end)
    else
      if bad then bad = nil end
      run("group:barrier()", function() return g:barrier() end)
    end
  elseif r == 11 then
    -- a new group (split by a color computed from the rank, or a list of ranks), used once at once
    local function use(ng)
      if not ng then return end
      local t = tp.ones({ 2 }, dtype)
      ng:all_reduce(t)
      expect(id .. " all_reduce on the new group", flat_of(t), { ng.size % (dtype == "u8" and 256 or 2 ^ 53),
        ng.size % (dtype == "u8" and 256 or 2 ^ 53) })
    end
    if chance(0.5) then
      local color = pick { 0, g.rank % 2, g.rank == 0 and -1 or 0 }
      local key = pick { nil, g.size - g.rank }
      if bad == 1 then color = 2 ^ 31 elseif bad == 2 then color = "red" elseif bad == 3 then key = 0.5
      elseif bad then bad = nil end
      run(("group:split(color %s, key %s)"):format(show(color), show(key)), function() use(g:split(color, key)) end)
    else
      local list = {}
      for q = 0, tp.size - 1 do if q == 0 or chance(0.6) then list[#list + 1] = q end end
      if chance(0.5) then for k = 1, #list / 2 do list[k], list[#list + 1 - k] = list[#list + 1 - k], list[k] end end
      if bad == 1 then list[#list + 1] = tp.size elseif bad == 2 then list[#list + 1] = 0
      elseif bad == 3 then list[#list + 1] = 0.5 elseif bad then bad = nil end
      run("tp.new_group({" .. show_args(list, #list) .. "})", function() use(tp.new_group(list)) end)
    end
  elseif r == 12 then
    log(id .. " tp.synchronize()")
    tp.synchronize()
  else
    -- a random single-rank call in between (this rank's own objects)
    random_call()
  end
end

local function collectives_part()
  local rev = {}
  for q = tp.size - 1, 0, -1 do rev[#rev + 1] = q end
  groups = { tp.world, tp.world:split(0), tp.world:split(tp.rank % 2), tp.new_group(rev) }
  for i = 1, opts.iters do
    collective_step(i)
    if opts.mismatch and i == opts.mismatch_at then
      local kind = opts.mismatch_kind
      -- What nothing sees at the call: outside check mode, MPI takes an all_reduce of 4 elements on one
      -- rank and 5 on another, two reduce ops, or a broadcast from two roots (the script's end compares
      -- the ranks' collectives and then fails the run, unless MPI reported the mismatch as a failure on
      -- some rank, which leaves that group out). A short unmatched send completes (eager protocol), and
      -- the script's end, comparing the ranks' sends and receives, fails the run (docs/check.md).
      local unseen = not tp.check.enabled() and (kind == 2 or kind == 4 or kind == 5)
      local line = ("fuzz_api: mismatch %d at step %d%s"):format(kind, i, unseen and " (may go unnoticed: status 0 allowed)"
        or "")
      log(("#%d MISMATCH on purpose: %s"):format(i, line))
      io.stderr:write(("[rank %d] %s\n"):format(tp.rank, line))
      local g, r = tp.world, tp.rank
      local x = tp.ones({ 4 })
      if kind == 1 then if r ~= 0 then g:all_reduce(x) end
      elseif kind == 2 then g:all_reduce(tp.ones({ r == 0 and 4 or 5 }))
      elseif kind == 3 then g:all_reduce(tp.ones({ 4 }, r == 0 and "f32" or "f64"))
      elseif kind == 4 then g:all_reduce(x, { op = r == 0 and "sum" or "max" })
      elseif kind == 5 then g:broadcast(x, { root = r == 0 and 0 or 1 % g.size })
      elseif kind == 6 then if r == 0 then g:all_reduce(x) else g:broadcast(x) end
      elseif kind == 7 then if r == 0 then g:send(tp.ones({ 1 }, "f32"), 1 % g.size) end
      elseif kind == 8 then if r == g.size - 1 then error("fuzz_api: an error on one rank, on purpose") end
      elseif kind == 9 then if r ~= 0 then tp.barrier() end
      elseif kind == 10 then
        if r == 0 then g:send(tp.ones({ 3 }), 1 % g.size) elseif r == 1 then g:recv(tp.ones({ 2 }), 0) end
      end
      x:totable()
    end
  end
  tp.synchronize()
end

-- ==== main ========================================================================================
local t0 = tp.now()
self_group = tp.world:split(tp.rank)
samples = {
  tensor = tp.zeros(1), stream = tp.default_stream(), event = tp.event(), group = tp.world, graph = empty_graph,
  work = self_group:all_reduce(tp.ones({ 1 })),
}
samples.work:block()
local timed = self_group:all_reduce(tp.ones({ 1 }), { timing = true })
local work_methods = {}
for _, m in ipairs { "wait", "block", "is_completed", "elapsed" } do
  local tm, um = timed[m], samples.work[m]
  -- either kind of Work: the method of the receiver's kind (a non-Work gets the ticket kind's)
  work_methods[m] = function(w, ...) if type(w) == "table" then return tm(w, ...) end return um(w, ...) end
end
samples.work = work_methods
keep("work", timed)
keep("group", self_group)

-- the scratch directory is where tp.trace.save and svg write (the files are removed at the end)
if opts.collectives then
  -- the same sequence on every rank; the mismatch (if any) at a step drawn from the seed too
  reseed(opts.seed)
  if opts.mismatch then
    local kind = rint(10)
    opts.mismatch_at, opts.mismatch_kind = rint(math.max(opts.iters, 1)), opts.mismatch_kind or kind
  end
  if tp.size < 2 and opts.mismatch then error("--mismatch needs at least 2 ranks", 0) end
  collectives_part()
else
  reseed(opts.seed + 7919 * tp.rank)
  for _ = 1, opts.iters do random_call() end
end
-- what the calls left on the streams surfaces here, not at the end of the script
pcall(tp.synchronize)
tp.check.enable(false)
tp.check.clear()
tp.check.strict(false)
for _, ext in ipairs { ".json", ".svg", "" } do os.remove(scratch .. ext) end

local summary = ("fuzz_api: seed %d, %s, %s%d single-rank calls (%d raised), %d findings, %.1f s; log %s"):format(
  opts.seed, opts.collectives and ("collectives on " .. tp.size .. " ranks") or ("rank " .. tp.rank),
  opts.collectives and ("%d collective steps (%d with a bad argument, refused), %d results checked, "):format(
    coll_runs, coll_refused, coll_checks) or "", ncalls, nerrors, #findings, (tp.now() - t0) / 1e3, logpath)
log(summary)
print = real_print
say(summary)
logf:close()
if #findings > 0 then
  for _, f in ipairs(findings) do io.stderr:write("  ", f, "\n") end
  os.exit(1)
end
