-- group.lua: groups of ranks and the collectives on tensors (API.md "Groups and collectives").
--
-- A group is a Lua table around a `tpsh_group *` (released by ffi.gc) with `rank`, `size`, `ranks`
-- (the world ranks, by group rank + 1) and `id`. Non-members of tp.new_group / g:split get nil.
--
-- Where a collective runs (the question the project exists to answer):
--   default          enqueued on the current stream, in order with the ops around it
--   async = true     on the group's comm stream ("comm<id>", high priority, created on first use),
--                    which first waits for the current stream; the call returns at once
--   stream = s       on s, which also first waits for the current stream (as torch.distributed does
--                    with its internal streams): the inputs a script just computed are always ready
-- Every call returns a Work (work.lua); on the current stream it is already ordered, so waiting on it
-- is free. Each call is checked and recorded first (a batch of one in C) and only then are the wait
-- and the collective enqueued, so bad input raises before anything is enqueued.
--
-- g:batch(fn, opts) runs fn, whose collectives on g are only recorded, then issues them as one group
-- launch (one MPI "start all, wait all" on the CPU, ncclGroupStart/End on CUDA) and returns one Work.
-- Collectives on other groups inside fn run as usual.
local ffi = require "ffi"
local capi = require "tpsh.capi"
local stream = require "tpsh.stream"
local tensor = require "tpsh.tensor"
local values = require "tpsh.values"
local work = require "tpsh.work"
require "tpsh.graph"                  -- declares tpsh_graph_capturing (lua_events reads it)
local C, check, raise = capi.C, capi.check, capi.raise
local is_tensor = tensor.is_tensor

local M = {}
local G = {}
-- A group is a Lua table whose own fields are the ones the collectives read on every call (_p, the C
-- group; _batch and _comm, false until set, so that reading them never reaches __index). Its public
-- fields (rank, size, ranks, id) live in _f behind __index, so that `g.rank = 3`, like a new field,
-- reaches __newindex and is refused, as on tensors, streams, events and Works: a script that changed
-- g.rank would otherwise fill and check its tensors with a rank the collectives do not use. `g.ranks`
-- is a new list at each read, for the same reason: an entry changed in place would make every later
-- read of g.ranks disagree with the group the collectives run on.
local group_mt = { __name = "group" }
group_mt.__index = function(g, k)
  local m = G[k]
  if m ~= nil then return m end
  local v = rawget(g, "_f")[k]
  if k == "ranks" then
    local copy = {}
    for i = 1, #v do copy[i] = v[i] end
    return copy
  end
  return v
end
local no_new_fields = capi.no_new_fields("group")
group_mt.__newindex = function(g, k)
  if rawget(g, "_f")[k] ~= nil then
    raise("group", ("cannot set %s: a group's %s is read-only"):format(capi.show(k), k))
  end
  no_new_fields(g, k)
end
group_mt.__tostring = function(g) return ("group(id=%d, rank=%d, size=%d)"):format(g.id, g.rank, g.size) end

local function wrap(p)
  p = ffi.gc(p, C.tpsh_group_release)
  local ranks = {}
  for r = 0, C.tpsh_group_size(p) - 1 do ranks[r + 1] = C.tpsh_group_world_rank(p, r) end
  local fields = { rank = C.tpsh_group_rank(p), size = C.tpsh_group_size(p), ranks = ranks,
    id = tonumber(C.tpsh_group_id(p)) }
  return setmetatable({ _p = p, _batch = false, _comm = false, _f = fields }, group_mt)
end

function M.is_group(v) return getmetatable(v) == group_mt end

local function want_group(g, name)
  if getmetatable(g) ~= group_mt then capi.not_self(name, "group", "g", g) end
  return g._p
end

-- ==== creation (collective) ========================================================================
local out_group = ffi.new("tpsh_group *[1]")

-- Whether integral number v fits C's int, as MPI and the core take ranks, colors and keys: a larger one
-- would reach C as another number (2^32 as -2147483648, and the message would show that).
local function fits_int(v) return v >= -2 ^ 31 and v < 2 ^ 31 end

-- Reads a Lua list of world ranks; on a bad value returns n = 0 and a message, so that this rank still
-- takes part in the collective check (which then fails on every rank) instead of leaving the others
-- waiting in it.
local function rank_array(ranks)
  if type(ranks) ~= "table" then return nil, 0, "expected a list of world ranks, got " .. capi.describe(ranks) end
  local n = #ranks
  local arr = ffi.new("int[?]", math.max(n, 1))
  for i = 1, n do
    local r = ranks[i]
    if type(r) ~= "number" or r ~= math.floor(r) then
      return arr, 0, ("item %d: expected an integer rank, got %s"):format(i, capi.show(r))
    end
    if not fits_int(r) then
      return arr, 0, ("rank %s is outside the world: expected ranks in [0, %d)"):format(capi.show(r), C.tpsh_size())
    end
    arr[i - 1] = r
  end
  return arr, n
end

local function created(rc, why, name)
  if why then raise(name, why) end
  check(rc, name)
  return out_group[0] ~= nil and wrap(out_group[0]) or nil
end

function M.new_group(ranks)
  local arr, n, why = rank_array(ranks)
  return created(C.tpsh_new_group(n, arr, out_group), why, "tp.new_group")
end

local SPLIT_WAIT = "group:split (collective over the group: every member must call it)"   -- as group.c says
local SPLIT_TAG = "group:split's check"       -- marks each member's part of that check (G.split)

function G.split(g, color, key)
  local p = want_group(g, "group:split")
  local why
  -- MPI takes both as C ints: a larger number would reach it as another one (2^31 as a negative color,
  -- which leaves the group without a word).
  local function int32(v) return type(v) == "number" and v == math.floor(v) and fits_int(v) end
  -- type(), not ~= nil: a NULL pointer cdata equals nil, and went on to the C call ("cannot convert")
  if type(color) ~= "nil" and not int32(color) then
    why = "color must be an integer below 2^31 (or nil / negative to stay out), got " .. capi.show(color)
  elseif type(key) ~= "nil" and not int32(key) then
    why = "key must be an integer in [-2^31, 2^31), got " .. capi.show(key)
  end
  -- The members first learn whether any of them passed a bad value, and then every one raises before
  -- the split, as tp.new_group does (its list is compared in C; here the values are Lua's to check): a
  -- rank that raised alone would leave the others with a group that lacks it, and the bad value itself
  -- would go on to the C call (a string key: "cannot convert 'string' to 'int'").
  -- The exchange is timed as the split's own wait is, under its name (the outer of nested waits names
  -- them): a rank that never comes is reported in group:split, not in tp.allgather.
  -- Each member's part is tagged: the exchange is an allgather of Lua values, so a member that called
  -- g:allgather (or tp.allgather on the world) at this point meets it, and untagged its value would be
  -- read as a reason ("rank 1 of the group passed a bad color or key: 1", for a rank that passed none)
  -- or, where false or nil, let the split go on to wait for a member that never comes. Such a member is
  -- named instead.
  local parts = values.allgather({ SPLIT_TAG, why or false }, p, "group:split", SPLIT_WAIT)
  if why then raise("group:split", why) end
  for r = 1, #parts do
    local part = parts[r]
    if type(part) ~= "table" or part[1] ~= SPLIT_TAG then
      raise("group:split", ("rank %d of the group is not in group:split: its host-side exchange at this point is "
        .. "another (a g:allgather or tp.allgather met this split's check of the colors and keys, and took this "
        .. "rank's part as its value); every member must call split at the same point"):format(r - 1))
    end
  end
  for r = 1, #parts do
    if parts[r][2] then
      raise("group:split", ("rank %d of the group passed a bad color or key: %s"):format(r - 1, parts[r][2]))
    end
  end
  return created(C.tpsh_group_split(p, color or -1, key or g.rank, out_group), nil, "group:split")
end

-- The number of collectives issued on g so far (each collective of a batch counts).
function G.seq(g) return tonumber(C.tpsh_group_seq(want_group(g, "group:seq"))) end

-- The backend's communicator for FFI interop: ncclComm_t on CUDA, a pointer to the MPI_Comm on the CPU.
function G.handle(g)
  local h = C.tpsh_group_handle(want_group(g, "group:handle"))
  if h ~= nil then return h end
end

-- ==== host side ====================================================================================
function G.barrier(g) values.barrier(want_group(g, "group:barrier"), "group:barrier") end
function G.allgather(g, v) return values.allgather(v, want_group(g, "group:allgather"), "group:allgather") end
function G.gather(g, v, root) return values.gather(v, root, want_group(g, "group:gather"), "group:gather") end
function G.bcast(g, v, root) return values.bcast(v, root, want_group(g, "group:bcast"), "group:bcast") end

-- ==== where it runs ================================================================================
local function comm_stream(g)
  if not g._comm then
    g._comm = stream.wrap_stream(capi.checkp(C.tpsh_group_comm_stream(g._p), "group comm stream"))
  end
  return g._comm
end
function G.comm_stream(g)
  want_group(g, "group:comm_stream")
  return comm_stream(g)
end

local function new_event(timing)
  return ffi.gc(capi.checkp(C.tpsh_event_create(timing), "event"), C.tpsh_event_release)
end

-- Whether Works get a start event (for w:elapsed()) when the call does not say: TPSH_COLL_TIMING=1.
-- Off by default, as in PyTorch's ProcessGroupNCCL: a timing event record costs about 1 us of host
-- time on the GPU machine (docs/perf.md), a tenth of a small collective.
local default_timing = os.getenv("TPSH_COLL_TIMING") == "1"

-- The streams of a call: s where it runs (opts.stream, the comm stream with opts.async, else the
-- current stream), which first waits for cur, the current stream.
local function streams(g, opts)
  local cur = stream.current_stream()
  if opts.stream ~= nil then return cur, opts.stream elseif opts.async then return cur, comm_stream(g) end
  return cur, cur
end

-- Whether a Work owns its events from Lua: when timed (w:elapsed reads both events after completion)
-- or in check mode (the sanitizer follows each event); they are released by the GC, and the Work holds
-- its tensors (k1, k2) in Lua. Otherwise a Work is a ticket of src/core/work.c (a pooled end event,
-- reused once it has completed; the ticket also holds the tensors' storages), wrapped in a cdata that
-- the garbage collector need not follow (work.lua).
-- Check mode is read from the core's flag itself, a load in compiled code rather than a call per
-- collective (tpsh_check_enabled() says the same). So is a graph's capture (tp.graph), whose Works own
-- their events too: a ticket's event would be queried later, which an event recorded in a capture cannot
-- be, and w:wait() inside the function must join the capture through that very event.
ffi.cdef "extern int tpsh_check_on;"
local function lua_events(opts)
  local timing = opts.timing
  if timing == nil then timing = default_timing end
  return timing or C.tpsh_check_on ~= 0 or C.tpsh_graph_capturing ~= 0, timing
end

local function ticket_work(name, s, ticket)
  if ticket < 0 then check(-ticket, name) end
  return work.ticket(name, s, ticket)
end

-- Issues what g's C batch holds, on the stream that opts pick, followed by the end event (preceded by
-- a start event when timed); C checks the batch before it enqueues any of that.
local function launch(g, name, opts, k1, k2)
  local cur, s = streams(g, opts)
  local own, timing = lua_events(opts)
  if own then
    local e0 = timing and new_event(1) or nil
    local e1 = new_event(timing and 1 or 0)
    local rc = C.tpsh_batch_end(s, g._p, cur, e0, e1)
    if rc ~= 0 then check(rc, name) end
    return work.new(name, s, e1, e0, k1, k2)
  end
  return ticket_work(name, s, C.tpsh_batch_end_work(s, g._p, cur))
end

local reduce_ops = { sum = C.TPSH_SUM, avg = C.TPSH_AVG, max = C.TPSH_MAX, min = C.TPSH_MIN, prod = C.TPSH_PROD }

local option_names = { async = true, stream = true, op = true, root = true, timing = true }
local empty = {}

-- The options each kind of call accepts besides timing (built once: not a table per call).
local WHERE = { async = true, stream = true }
local WHERE_OP = { async = true, stream = true, op = true }
local WHERE_ROOT = { async = true, stream = true, root = true }

-- The keys of an options table are checked without a loop. LuaJIT counts a loop that is left at once
-- (pairs over {} or {async = true}) as hot, cannot record it as a trace of its own, and after a few
-- tries blacklists it; from then on every trace that reaches it aborts, so the caller's loop of
-- collectives ran in the interpreter, 2 us a call slower. It happened in some processes and not in
-- others (LuaJIT hashes its hot counters and draws its penalties at random): the bimodal small-message
-- times of bench_collectives on the GPU machine. next() compiles, and an options table has at most as
-- many valid keys as option_names, so five steps and one more look at every key of a valid table.
local function bad_key(k, allowed)
  return not option_names[k] or (allowed and not allowed[k] and k ~= "timing")
end

local function unknown_option(opts, allowed)
  local k = next(opts)
  if k == nil then return nil elseif bad_key(k, allowed) then return k end
  k = next(opts, k)
  if k == nil then return nil elseif bad_key(k, allowed) then return k end
  k = next(opts, k)
  if k == nil then return nil elseif bad_key(k, allowed) then return k end
  k = next(opts, k)
  if k == nil then return nil elseif bad_key(k, allowed) then return k end
  k = next(opts, k)
  if k == nil then return nil elseif bad_key(k, allowed) then return k end
  return next(opts, k)          -- a sixth key: five valid names are taken, so it is not one
end

local function read_opts(name, opts, allowed)
  if opts == nil then return empty end
  if type(opts) ~= "table" then raise(name, "expected a table of options, got " .. capi.describe(opts)) end
  local bad = unknown_option(opts, allowed)
  if bad ~= nil then
    -- the error path only: the names this call takes, as capi.check_options lists them for other calls
    local names = {}
    for k in pairs(allowed or option_names) do names[#names + 1] = k end
    if allowed then names[#names + 1] = "timing" end
    table.sort(names)
    raise(name, ("unknown option %s (expected %s)"):format(capi.show(bad), table.concat(names, ", ")))
  end
  if opts.stream ~= nil then stream.want_stream(opts.stream, name, " as opts.stream") end
  capi.want_flag(name, opts, "async")
  capi.want_flag(name, opts, "timing")
  return opts
end

local function read_op(name, opts)
  local op = opts.op or "sum"
  local id = reduce_ops[op]
  if not id then
    raise(name, ("unknown reduce op %s: expected \"sum\", \"avg\", \"max\", \"min\" or \"prod\""):format(
      type(op) == "string" and ("%q"):format(op) or tostring(op)))
  end
  return id
end

-- C takes a rank as an int: a larger number would reach it as another (2^32 as -2147483648), so it is
-- refused here, shown as given, in C's words. Within an int, the range is C's check.
local function read_rank(name, what, v, g)
  if type(v) ~= "number" or v ~= math.floor(v) then
    raise(name, ("%s must be an integer rank of the group, got %s"):format(what, capi.show(v)))
  end
  if not fits_int(v) then
    raise(name, ("%s %s is outside the group: expected a rank in [0, %d)"):format(what, capi.show(v), g.size))
  end
  return v
end

-- Appends what a Work keeps alive to g:batch's list: k is a tensor, a list of tensors or nil.
local function keep_in(list, k)
  if is_tensor(k) then list[#list + 1] = k
  elseif k then for i = 1, #k do list[#list + 1] = k[i] end end
end

-- The batch path, for calls that `call(s, p, ...)` records in g's C batch: inside g:batch it stays
-- recorded (g:batch picks the streams; g:batch cancels the C batch on an error), otherwise it is
-- issued at once as a batch of one by launch(). s is the stream the batch will run on: a recorded call
-- does not run there yet, but the list form of all_gather allocates its temporary there. Allocated on
-- the default stream, the temporary could be a block that the default stream has just freed and still
-- uses (CUDA's pool reuses a block in its stream's order at once), and the collective, on another
-- stream that never waited for the default one, would write into it meanwhile.
local function through_batch(g, name, opts, k1, k2, call, ...)
  local p = g._p
  local b = g._batch
  if b then
    if opts.async or opts.stream then raise(name, "inside g:batch, give async or stream to g:batch itself") end
    local rc = call(b.stream, p, ...)
    if rc ~= 0 then check(rc, name) end
    keep_in(b.tensors, k1)
    keep_in(b.tensors, k2)
    return nil
  end
  local _, s = streams(g, opts)
  check(C.tpsh_batch_begin(p), name)
  local rc = call(s, p, ...)
  if rc ~= 0 then
    local msg = capi.last_error()
    C.tpsh_batch_cancel(p)
    raise(name, msg)
  end
  return launch(g, name, opts, k1, k2)
end

-- Runs one collective: kind (C.TPSH_C_*), the tensors a and b (b nil for one-tensor calls), arg (the
-- root or the peer) and op, as tpsh_collective takes them. An untimed Work outside check mode and
-- outside g:batch is one C call (tpsh_collective_work); the rest takes the batch path. k1 and k2 are
-- what the Work keeps alive: each a tensor, a list of tensors or nil (two fields rather than a list
-- built per call: a small collective's Lua cost is mostly the garbage it makes).
local function collective(g, name, opts, k1, k2, kind, a, b, arg, op)
  if not g._batch and not lua_events(opts) then
    local cur, s = streams(g, opts)
    return ticket_work(name, s, C.tpsh_collective_work(s, g._p, cur, kind, a, b, arg, op))
  end
  return through_batch(g, name, opts, k1, k2, C.tpsh_collective, kind, a, b, arg, op)
end

function G.batch(g, fn, opts)
  local p = want_group(g, "group:batch")
  if type(fn) ~= "function" then raise("group:batch", "expected a function, got " .. capi.describe(fn)) end
  opts = read_opts("group:batch", opts, WHERE)
  if g._batch then raise("group:batch", "a batch is already open on this group (batches do not nest)") end
  -- b is made before the C batch opens: an allocation between the two could run a finalizer that
  -- raises, and the batch would stay open with no g._batch to close it
  local _, run = streams(g, opts)              -- where launch() will issue it (through_batch says why)
  local b = { tensors = {}, stream = run }
  check(C.tpsh_batch_begin(p), "group:batch")
  g._batch = b
  -- Inside a coroutine, fn runs in a coroutine of its own, so that a coroutine.yield in it comes back
  -- here instead of suspending the caller with the batch open (pcall lets a yield through): the
  -- collectives on g that the program then issued elsewhere would be recorded in that batch, and never
  -- issued if the coroutine is not resumed. Refusing the yield keeps the batch within this call
  -- (recording the opener and refusing calls from elsewhere would leave the batch open for good once
  -- the opener is dropped). On the main thread a yield is already an error, and pcall alone spares the
  -- coroutine's cost (create and resume: 0.15 us and a trace that ends there; coroutine.running: 16 ns).
  local ok, err
  if coroutine.running() then
    local co = coroutine.create(fn)
    ok, err = coroutine.resume(co)
    if ok and coroutine.status(co) ~= "dead" then
      g._batch = false
      C.tpsh_batch_cancel(p)
      raise("group:batch", "the function yielded (coroutine.yield inside g:batch): the batch's calls are issued "
        .. "when it returns, so it must return without yielding; nothing was issued")
    end
  else
    ok, err = pcall(fn)
  end
  g._batch = false
  if not ok then
    C.tpsh_batch_cancel(p)
    error(err, 0)
  end
  return launch(g, "group:batch", opts, b.tensors)   -- k2 nil
end

-- ==== collectives ==================================================================================
local want = tensor.want
local list_buf = ffi.new("tpsh_tensor *[?]", 64)


function G.all_gather(g, out, x, opts)
  local name = "group:all_gather"
  want_group(g, name)
  want(x, name, 2)
  opts = read_opts(name, opts, WHERE)
  if is_tensor(out) then
    return collective(g, name, opts, out, x, C.TPSH_C_ALL_GATHER, out, x, 0, 0)
  end
  if type(out) ~= "table" then
    raise(name, "expected a tensor or a list of tensors as argument 1, got " .. capi.describe(out))
  end
  local n = #out
  local buf = n <= 64 and list_buf or ffi.new("tpsh_tensor *[?]", n)
  local keep = { x }
  for i = 1, n do
    if not is_tensor(out[i]) then
      raise(name, ("output list item %d: expected a tensor, got %s"):format(i, capi.describe(out[i])))
    end
    buf[i - 1] = out[i]
    keep[i + 1] = out[i]
  end
  -- the list form has a C call of its own, and takes the batch path even untimed (no hot loop uses it)
  return through_batch(g, name, opts, keep, nil, C.tpsh_all_gather_list, n, buf, x)
end

function G.all_reduce(g, t, opts)
  local name = "group:all_reduce"
  want_group(g, name)
  want(t, name, 1)
  opts = read_opts(name, opts, WHERE_OP)
  return collective(g, name, opts, t, nil, C.TPSH_C_ALL_REDUCE, t, t, 0, read_op(name, opts))
end

function G.reduce_scatter(g, out, x, opts)
  local name = "group:reduce_scatter"
  want_group(g, name)
  want(out, name, 1)
  want(x, name, 2)
  opts = read_opts(name, opts, WHERE_OP)
  return collective(g, name, opts, out, x, C.TPSH_C_REDUCE_SCATTER, out, x, 0, read_op(name, opts))
end

-- broadcast and reduce take {root =, ...} or a bare root number.
local function root_opts(opts)
  if type(opts) == "number" then return { root = opts } end
  return opts
end

function G.broadcast(g, t, opts)
  local name = "group:broadcast"
  want_group(g, name)
  want(t, name, 1)
  opts = read_opts(name, root_opts(opts), WHERE_ROOT)
  return collective(g, name, opts, t, nil, C.TPSH_C_BROADCAST, t, nil, read_rank(name, "root", opts.root or 0, g), 0)
end

function G.reduce(g, t, opts)
  local name = "group:reduce"
  want_group(g, name)
  want(t, name, 1)
  opts = read_opts(name, root_opts(opts), nil)
  return collective(g, name, opts, t, nil, C.TPSH_C_REDUCE, t, nil, read_rank(name, "root", opts.root or 0, g),
    read_op(name, opts))
end

function G.all_to_all(g, out, x, opts)
  local name = "group:all_to_all"
  want_group(g, name)
  want(out, name, 1)
  want(x, name, 2)
  opts = read_opts(name, opts, WHERE)
  return collective(g, name, opts, out, x, C.TPSH_C_ALL_TO_ALL, out, x, 0, 0)
end

-- send and recv: one point-to-point shape, two kinds.
local function point_to_point(name, kind)
  return function(g, t, peer, opts)
    want_group(g, name)
    want(t, name, 1)
    opts = read_opts(name, opts, WHERE)
    return collective(g, name, opts, t, nil, kind, t, nil, read_rank(name, "peer", peer, g), 0)
  end
end
G.send = point_to_point("group:send", C.TPSH_C_SEND)
G.recv = point_to_point("group:recv", C.TPSH_C_RECV)

-- ==== install ======================================================================================
function M.install(tp)
  tp.world = wrap(capi.checkp(C.tpsh_world(), "tp.world"))
  tp.new_group = M.new_group
  tp.is_group = M.is_group
  tp.is_work = work.is_work
end

M.methods = G
return M
