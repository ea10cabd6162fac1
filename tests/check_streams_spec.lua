-- The stream sanitizer with many streams made and dropped: a destroyed stream's slot (its entry of
-- every vector clock) goes to a later stream, so that check mode's memory follows the streams alive at
-- once, not every stream ever made (20k short-lived streams took 1.2 GB before), and a stream given a
-- reused slot is judged exactly as one with a slot of its own (docs/check.md, sanitizer.c). Runs on any
-- number of ranks and any backend; check mode is on for each test's duration, as in check_spec.lua.
local ffi = require "ffi"
local C = ffi.C

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cm = dofile(here .. "support/check_mode.lua")
local next_line, describe_reports = cm.next_line, cm.describe_reports
local at = cm.at_of("check_streams_spec%.lua")

local function clock_size() return C.tpsh_check_clock_size() end

-- Drops what the script no longer holds: streams die when the collector takes them and no storage
-- still names them.
local function settle()
  collectgarbage()
  collectgarbage()
  tp.synchronize()
end

-- n streams made one after another, each used and dropped: the shape of a loop that makes a stream
-- per step. Each leaves its epoch high (pump event records) and known to the current stream, so that
-- a later owner of its slot starts where clocks already hold large values for that slot.
local function churn(n, pump)
  for i = 1, n do
    local s = tp.stream()
    s:wait_stream(tp.current_stream())
    tp.with_stream(s, function() local y = tp.ones { 16 }; y:add_(1) end)
    for _ = 1, pump or 1 do tp.current_stream():wait_stream(s) end
    if i % 10 == 0 then settle() end
  end
  settle()
end

describe("stream sanitizer: slots of destroyed streams are reused", function()
  before_each(cm.on)
  after_each(cm.off)

  it("300 streams made and dropped one after another add a handful of clock entries, not 300", function()
    churn(10)                                    -- the first slots, and whatever the runner holds
    local before = clock_size()
    assert.is_true(before >= 2, "clock size " .. before)
    churn(300)
    local grew = clock_size() - before
    -- at most the 10 streams alive between two collections, and a few the collector kept
    assert.is_true(grew <= 30, "the clocks grew by " .. grew .. " entries for 300 streams made one at a time")
    assert.are.equal(0, #tp.check.reports(), describe_reports(tp.check.reports()))
  end)

  it("a race between two streams on reused slots is reported, naming them", function()
    churn(40, 20)
    local before = clock_size()
    local a, b = tp.stream { name = "recycled_a" }, tp.stream { name = "recycled_b" }
    a:wait_stream(tp.current_stream())
    b:wait_stream(tp.current_stream())
    assert.are.equal(before, clock_size(), "the two streams took new slots: nothing here is recycled")
    local x = tp.zeros { 256 }
    a:wait_stream(tp.current_stream())
    b:wait_stream(tp.current_stream())
    local w = next_line()
    tp.with_stream(a, function() x:fill_(1) end)
    local bad = next_line()
    local y = tp.with_stream(b, function() return x * 2 end)
    local r = cm.expect_report(at, "read%-after%-write", bad, w)
    assert.are.equal("recycled_b", r.stream)
    assert.are.equal("recycled_a", r.other_stream)
  end)

  it("a stream that knew a slot's old owner is not ordered after its new one", function()
    -- The current stream waited 20 times for each dropped stream: its clock holds those streams'
    -- epochs. A new stream on one of their slots must count from above them, or its write would
    -- look ordered before the current stream's read.
    churn(40, 20)
    local before = clock_size()
    local a = tp.stream { name = "recycled" }
    a:wait_stream(tp.current_stream())
    assert.are.equal(before, clock_size(), "the stream took a new slot: nothing here is recycled")
    local x = tp.zeros { 256 }
    a:wait_stream(tp.current_stream())
    local w = next_line()
    tp.with_stream(a, function() x:fill_(1) end)
    local bad = next_line()
    local y = x + 1
    local r = cm.expect_report(at, "read%-after%-write", bad, w)
    assert.are.equal("recycled", r.other_stream)
  end)

  it("the host that synchronised a slot's old owner has not seen its new one's write", function()
    churn(40, 20)
    local before = clock_size()
    local a = tp.stream { name = "recycled" }
    local x = tp.zeros { 1 }
    a:wait_stream(tp.current_stream())
    assert.are.equal(before, clock_size(), "the stream took a new slot: nothing here is recycled")
    local w = next_line()
    tp.with_stream(a, function() x:fill_(1) end)
    local bad = next_line()
    local v = x:item()                          -- waits for the current stream only
    cm.expect_report(at, "host read of an unsynchronised write", bad, w)
  end)

  it("a correct schedule on reused slots gives no report", function()
    churn(40, 20)
    local before = clock_size()
    local a, b = tp.stream { name = "recycled_a" }, tp.stream { name = "recycled_b" }
    local x = tp.zeros { 256 }
    a:wait_stream(tp.current_stream())
    tp.with_stream(a, function() x:fill_(1) end)
    b:wait_stream(a)
    local y = tp.with_stream(b, function() return x * 2 end)
    tp.current_stream():wait_stream(b)
    assert.are.equal(512, y:sum():item())
    assert.are.equal(before, clock_size(), "the streams took new slots: nothing here is recycled")
    tp.synchronize()
    assert.are.equal(0, #tp.check.reports(), describe_reports(tp.check.reports()))
  end)

  it("the same race on a new stream each time is reported each time, a slot reused or not", function()
    settle()
    local sizes = {}
    local line
    for i = 1, 5 do
      local x = tp.zeros { 16 }
      x:fill_(i)
      local s = tp.stream { name = "step" .. i }
      line = next_line()
      tp.with_stream(s, function() return x + 1 end)
      tp.current_stream():wait_stream(s)     -- ordered before x's free: no report there
      x, s = nil, nil
      settle()
      sizes[i] = clock_size()
    end
    local rs = tp.check.reports()
    assert.are.equal(5, #rs, describe_reports(rs))
    for i, r in ipairs(rs) do
      assert.truthy(r.kind:find("read%-after%-write"), r.kind)
      assert.is_true(at(r.location, line), describe_reports(rs))
      assert.are.equal("step" .. i, r.stream)
    end
    assert.are.equal(sizes[2], sizes[5], "each step's stream should reuse the slot of the one before")
  end)

  it("tp.synchronize orders the writes of steps' streams that a tensor already let go of", function()
    -- A tensor lets go of the streams that used it once they are unreachable and idle (tensor.c's
    -- prune_users), and their slots retire. tp.synchronize joined only the live streams, so the read
    -- after it was reported against every step whose stream had been let go (an audit found it).
    local count = ffi.C.tpsh_stream_count
    settle()
    local before = count()
    local x = tp.zeros { 4, 16 }
    for i = 1, 4 do
      local s = tp.stream { name = "step" .. i }
      s:wait_stream(tp.current_stream())
      tp.with_stream(s, function() x:select(1, i):fill_(i) end)
      s = nil
    end
    -- Until x has let go of the four (each is let go once its fill_ is done, which the host must not
    -- be seen to wait for): fresh streams that touch no byte of x fill its list of users, which prunes
    -- it when full; each probe is let go in turn.
    repeat
      collectgarbage()
      collectgarbage()
      local probe = tp.stream()
      tp.with_stream(probe, function() x:narrow(1, 1, 0):fill_(0) end)
      probe = nil
      collectgarbage()
    until count() - before <= 1
    tp.synchronize()
    assert.are.equal(160, x:sum():item())
    x = nil
    settle()
    assert.are.equal(0, #tp.check.reports(), describe_reports(tp.check.reports()))
  end)
end)
