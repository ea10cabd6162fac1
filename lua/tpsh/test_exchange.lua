-- tpsh.test_exchange: the exchanges of `tpsh test` between ranks, and what is compared at each.
--
-- Every exchange of the runner runs on a group of its own (a copy of the world, made once before
-- the first exchange), never on the world that the specs use: a test where one rank calls
-- tp.allgather and the others do not would otherwise pair that call with the runner's exchange on
-- the other ranks, and the runner would tell every later test another test's outcome. Each payload
-- also names its step (a count, and the test and stage in words): ranks found at different steps are
-- reported as out of step and the run stops, rather than being trusted. After each step that ran spec
-- code (a test, a block's body, its hooks) the ranks' records of what they issued on each group are
-- compared (step_checks).
local ffi = require "ffi"
local issued = require "tpsh.issued"

local M = {}
local fmt, insert = string.format, table.insert
local C = ffi.C

M.OUT_OF_STEP = {}   -- key of the error object raised by an exchange that found ranks out of step
local OUT_OF_STEP = M.OUT_OF_STEP

-- The watchdog names the wait it times out on; the runner's waits say which test they follow.
local have_watch = pcall(function()
  return C.tpsh_watch_exchange_begin, C.tpsh_watch_wait_end, C.tpsh_watch_test, C.tpsh_watch_step
end)

-- An asynchronous error (NCCL's: a peer gone) that tpsh noted during a test and no call of the test
-- raised: the test fails with it, rather than the next test's first wait, or, after the last test,
-- nothing (`tpsh test` has no end-of-script synchronize).
local have_async = pcall(function() return C.tpsh_async_error_check end)
local function async_error_left()
  if have_async and C.tpsh_async_error_check() ~= 0 then return require("tpsh.capi").last_error() end
end

function M.new(tp)
  local g   -- the runner's group; with one rank nothing can be out of step, and tp's calls are local
  if tp.size > 1 then g = tp.world:split(0, tp.rank) end
  local x = { n = 0, keep = {}, check = tp.check }   -- check: tp.check, for reports a test leaves

  -- failure: this rank's failure in the running test, told to the other ranks' watchdogs (a rank
  -- blocked in a collective that this rank will now never call ends the run quoting it, watchdog.c).
  local function watched(what, f, v, failure)
    if not (g and have_watch) then return f(v) end
    local label = "tpsh test's exchange at " .. what .. "; a rank that has not come to it is still in an "
      .. "earlier step (in a collective that not every rank called?)"
    x.keep[x.n % 4] = label          -- the watchdog reads the text while the wait lasts
    C.tpsh_watch_exchange_begin(label, failure)
    local ok, r = pcall(f, v)
    C.tpsh_watch_wait_end()
    if not ok then error(r, 0) end
    return r
  end
  local function allgather(v) if g then return g:allgather(v) end return tp.allgather(v) end

  -- A test begins (before its setup): the watchdog takes notices of failures in this test only.
  -- step: the test (or the loading) in words, for the message should the watchdog end the run in it.
  x.tests = 0
  x.digests = {}   -- different_collectives' record of each group's digests after the last test
  x.p2p_seen = {}  -- unmatched_p2p's record of every rank's sends and receives after the last test
  function x.begin_test(step)
    x.tests = x.tests + 1
    if g and have_watch then C.tpsh_watch_step(step); C.tpsh_watch_test(x.tests) end
  end
  function x.end_tests() if g and have_watch then C.tpsh_watch_test(0); C.tpsh_watch_step(nil) end end

  function x.bcast(v) if g then return g:bcast(v, 0) end return tp.bcast(v, 0) end

  -- Every rank's payload (a table); what: the step in words ("test 'x', its result").
  -- note: words for the watchdog's message only (this rank's own news), not compared across ranks.
  -- failure: this rank's failure in the running test, if any, for the other ranks' watchdogs.
  function x.all(payload, what, note, failure)
    x.n = x.n + 1
    payload.step, payload.at = x.n, what
    local all = watched(what .. (note or ""), allgather, payload, failure)
    local function at(p)
      if type(p) ~= "table" or type(p.at) ~= "string" or type(p.step) ~= "number" then
        return "something that is not the runner's (" .. type(p) .. ")"
      end
      return fmt("%s (exchange %d)", p.at, p.step)
    end
    local bad, ref = {}, at(all[1])
    for r = 2, #all do
      local a = at(all[r])
      if a ~= ref then
        insert(bad, { r - 1, fmt("ranks are out of step: rank %d is at %s, rank 0 at %s; the run stops here",
          r - 1, a, ref) })
      end
    end
    if #bad > 0 then error({ [OUT_OF_STEP] = bad }, 0) end
    return all
  end

  -- The ranks agree on how a step before a test body went. mine: nil, { err = text } or
  -- { skip = reason }. Returns "ok", "fail" (some rank failed) or "skip", the same on every rank.
  function x.agree(mine, what)
    local failure = mine and mine.err and (what .. ": " .. tostring(mine.err)) or nil
    local all, st = x.all({ err = mine and mine.err, skip = mine and mine.skip }, what, nil, failure), "ok"
    for _, p in ipairs(all) do
      if p.err then return "fail" end
      if p.skip then st = "skip" end
    end
    return st
  end
  return x
end

-- After a test, the members of a group must have issued the same number of collectives on it (sends
-- and receives aside): where they have not, a collective that not every rank called waits for the
-- others (on a stream: the test may have passed), and every later one on that group would be paired
-- with the wrong call. Returns nil, or the failure's entries ({rank, message}), the same on every rank.
local function uneven_collectives(groups, step)
  local entries = {}
  for _, gr in ipairs(issued.uneven(groups) or {}) do
    local msg = fmt("after %s the ranks have issued different numbers of collectives on group %s (world "
      .. "ranks %s): %s. The ones that not every rank called wait for the others, and later ones would be paired "
      .. "with the wrong calls: the run stops here", step, gr.id, gr.ranks, issued.counts_text(gr))
    for _, m in ipairs(gr.members) do insert(entries, { m, msg }) end
  end
  return #entries > 0 and entries or nil
end

-- After a test whose ranks issued as many collectives on each group, they must have issued the same
-- ones in it (issued.different). MPI and NCCL complete some such pairs (two reduce ops, two roots; NCCL
-- an all_reduce against a reduce), so the test may have passed on results not to be trusted.
-- seen: issued.different's record, kept across tests. Returns nil, or the failure's entries.
local function different_collectives(groups, step, seen)
  local entries = {}
  for _, f in ipairs(issued.different(groups, seen) or {}) do
    local gr = f.group
    local msg = fmt("in %s the ranks issued different collectives on group %s (world ranks %s): as many as "
      .. "each other, but rank %d's and rank %d's differ in the kind, element type, count, root or reduce op of at "
      .. "least one. MPI or NCCL completed them, so the test's results are not to be trusted (--check names the call)",
      step, gr.id, gr.ranks, f.a, f.b)
    for _, m in ipairs(gr.members) do insert(entries, { m, msg }) end
  end
  return #entries > 0 and entries or nil
end

---------------------------------------------------------------------------------------------------
-- After a test, what each rank sent to another in it must be what that one received (issued.p2p_unmatched).
-- A send without its receive completes unnoticed when small (MPI's eager protocol on the CPU backend) and
-- a later receive from that rank would take its message; a receive without its send waits on its stream.
-- Either way later tests cannot be trusted: the run stops there, as it does for collectives left waiting.
-- Returns nil, or the failure's entries ({rank, message}) for both ranks of each pair, the same everywhere.
local function unmatched_p2p(all, step, seen)
  local entries = {}
  for _, u in ipairs(issued.p2p_unmatched(all, seen) or {}) do
    local msg = u.groups
      and fmt("in %s rank %d sent %d message(s) to rank %d, which received as many from it, but not on the "
        .. "same groups (a send meets only a receive on its own group)", step, u.from, u.sent, u.to)
      or fmt("in %s rank %d sent %d message(s) to rank %d, which received %d from it (%s)", step, u.from, u.sent,
        u.to, u.received, u.sent > u.received and "a send that no rank receives is lost on the CPU backend, or taken "
        .. "by a later receive, and waits forever on NCCL" or "a receive whose send never comes waits forever")
    msg = msg .. ": the run stops here"
    insert(entries, { u.from, msg })
    if u.to ~= u.from then insert(entries, { u.to, msg }) end
  end
  return #entries > 0 and entries or nil
end


-- The checks after a step whose every rank's payload (all) carries .colls and .p2p: nil, or the
-- failure's entries of collectives issued differently (a failure, the run goes on), and nil or the
-- error object that stops the run (collectives left waiting, sends and receives left unmatched).
function M.step_checks(x, all, step)
  local listed = issued.listed(all)
  local uneven = uneven_collectives(listed, step)
  -- (with uneven counts the run stops; digests only compare collectives issued alike in number)
  local differ = not uneven and different_collectives(listed, step, x.digests)
  local unmatched = unmatched_p2p(all, step, x.p2p_seen)
  local stop = uneven and { [OUT_OF_STEP] = uneven, title = "collectives left waiting", abandon = true }
    or unmatched and { [OUT_OF_STEP] = unmatched, title = "sends and receives left unmatched", abandon = true }
  return differ or nil, stop or nil
end

-- This rank's records for a payload.
function M.records(payload)
  payload.colls = have_watch and issued.mine() or nil
  payload.p2p = have_watch and issued.p2p_mine() or nil
  return payload
end

M.async_error_left = async_error_left
M.have_watch = have_watch
return M
