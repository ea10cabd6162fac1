-- The stream sanitizer (tp.check) on a corpus of schedules: each wrong one must be reported at the
-- line of the offending access (and name the line of the access it conflicts with), each correct one
-- must give no report. Runs on any number of ranks and any backend; the specs turn check mode on for
-- their own duration, so they run in the normal suite without --check. The collective mismatch check
-- needs 2 or more ranks and passes trivially on 1.
local g = tp.world

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cm = dofile(here .. "support/check_mode.lua")
local next_line, describe_reports, expect_none = cm.next_line, cm.describe_reports, cm.expect_none
local check_on, check_off = cm.on, cm.off
local at = cm.at_of("check_spec%.lua")

-- Exactly one report, of a kind matching kind_pattern, at line (and, when given, against other_line).
local function expect_report(kind_pattern, line, other_line) return cm.expect_report(at, kind_pattern, line, other_line) end

describe("stream sanitizer: wrong schedules are reported at their line", function()
  before_each(check_on)
  after_each(check_off)

  it("a side stream reads what the default stream writes (read after write)", function()
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 256 }
    tp.spin(20)
    local w = next_line()
    x:fill_(1)
    local bad = next_line()
    local y = tp.with_stream(side, function() return x * 2 end)
    expect_report("read%-after%-write", bad, w)
  end)

  it("a side stream fills a tensor allocated on the default stream without waiting for it", function()
    -- The allocation is ordered on the default stream: on a GPU the pool may hand tp.empty a block
    -- that a kernel still queued there reads (a tensor freed after it), and side wrote over it. The
    -- allocation was no access at all, so nothing was reported (a review of the CUDA backend).
    local side = tp.stream { name = "side" }
    local a = next_line()
    local out = tp.empty { 256 }
    local bad = next_line()
    tp.with_stream(side, function() out:fill_(5) end)
    local r = expect_report("new tensor on a stream that did not wait for its allocation", bad, a)
    assert.truthy(r.message:find("make 'side' wait for 'default' after the allocation", 1, true), r.message)
  end)

  it("a side stream fills a new tensor whose cached block work queued on the default stream still reads", function()
    -- The caching allocator hands the block x was freed from to the next allocation on the default
    -- stream at once (the spin keeps the read of x queued): a use-after-free that nothing but the
    -- sanitizer sees, and the report says where the block came from.
    local side = tp.stream { name = "side" }
    local x = tp.ones { 3333 }
    tp.spin(30)
    local y = x * 2
    local p = tostring(x:data_ptr())
    x:free()
    local a = next_line()
    local z = tp.empty { 3333 }
    local bad = next_line()
    tp.with_stream(side, function() z:fill_(5) end)
    if tp.memory_stats().caching then assert.are.equal(p, tostring(z:data_ptr())) end
    local r = expect_report("new tensor on a stream that did not wait for its allocation", bad, a)
    if tp.memory_stats().caching then
      assert.truthy(r.message:find("handed to it from the cache", 1, true), r.message)
      assert.truthy(r.message:find("check_spec.lua:", 1, true), r.message)
    end
    tp.synchronize()
  end)

  it("the default stream overwrites what a side stream still reads (write after read)", function()
    local side = tp.stream { name = "side" }
    local x = tp.ones { 256 }
    side:wait_stream(tp.current_stream())
    local r = next_line()
    local y = tp.with_stream(side, function() tp.spin(20); return x + 1 end)
    local bad = next_line()
    x:fill_(5)
    expect_report("write%-after%-read", bad, r)
  end)

  it("overwrites what two side streams read after waiting for one of them (the other's read stays on record)", function()
    -- a read supersedes the earlier reads it covers on its own stream only: b's read must not hide a's
    local a, b = tp.stream { name = "a" }, tp.stream { name = "b" }
    local x = tp.ones { 64 }
    a:wait_stream(tp.current_stream())
    b:wait_stream(tp.current_stream())
    local r = next_line()
    local ya = tp.with_stream(a, function() return x + 1 end)
    local yb = tp.with_stream(b, function() return x + 2 end)
    tp.current_stream():wait_stream(b)
    local bad = next_line()
    x:fill_(5)
    expect_report("write%-after%-read", bad, r)
  end)

  it("two streams write one tensor (write after write)", function()
    local a, b = tp.stream { name = "a" }, tp.stream { name = "b" }
    local x = tp.zeros { 64 }
    a:wait_stream(tp.current_stream())
    b:wait_stream(tp.current_stream())
    local first = next_line()
    tp.with_stream(a, function() x:fill_(1) end)
    local bad = next_line()
    tp.with_stream(b, function() x:fill_(2) end)
    expect_report("write%-after%-write", bad, first)
  end)

  it("reads an async all_reduce's output without w:wait()", function()
    local x = tp.ones { 32 }
    local coll = next_line()
    local w = g:all_reduce(x, { async = true })
    local bad = next_line()
    local y = x * 2
    w:wait()
    expect_report("read%-after%-write", bad, coll)
  end)

  it("reads an async all_gather's output without w:wait()", function()
    local x = tp.ones { 8 }
    local out = tp.empty { 8 * tp.size }
    local coll = next_line()
    local w = g:all_gather(out, x, { async = true })
    local bad = next_line()
    local s = out:sum()
    w:wait()
    expect_report("read%-after%-write", bad, coll)
  end)

  it("adds in place to an async all_reduce's tensor before w:wait(): one report for the pair", function()
    -- add_ reads and writes t, and both race with the all_reduce's write: reported twice before
    local t = tp.ones { 8 }
    local coll = next_line()
    local w = g:all_reduce(t, { async = true })
    local bad = next_line()
    t:add_(1)
    w:wait()
    expect_report("read%-after%-write", bad, coll)
  end)

  it("reads a list all_gather's output in an async g:batch without w:wait(), naming the all_gather's line", function()
    -- the copies to the list's tensors are issued with the batch: reported at g:batch's last line and
    -- as copy_ before
    local x, other = tp.ones { 8 }, tp.ones { 8 }
    local outs = {}
    for i = 1, tp.size do outs[i] = tp.empty { 8 } end
    local coll
    local w = g:batch(function()
      coll = next_line()
      g:all_gather(outs, x)
      local y = other * 2
    end, { async = true })
    local bad = next_line()
    local s = outs[1]:sum()
    w:wait()
    expect_report("read%-after%-write", bad, coll)
    assert.truthy(tp.check.reports()[1].message:find("all_gather (its copy to a list output)", 1, true),
      tp.check.reports()[1].message)
  end)

  it("reads an async all_gather's output without w:wait(), a freed tensor's memory reused in between", function()
    -- Any allocation frees parked blocks whose uses are done; asking that used to tell the sanitizer
    -- that the host had seen the comm stream's work finish, and the race below went unreported.
    local tmp = tp.ones { 4 }
    g:all_reduce(tmp, { async = true }):wait()
    local x, out = tp.ones { 8 }, tp.empty { 8 * tp.size }
    local coll = next_line()
    local w = g:all_gather(out, x, { async = true })
    tmp = nil
    collectgarbage()
    collectgarbage()
    local t0 = tp.now()
    while tp.now() - t0 < 30 do end       -- long enough for the comm stream to finish
    local z = tp.empty { 1 }              -- an allocation: polls the parked free
    local bad = next_line()
    local s = out:sum()
    w:wait()
    expect_report("read%-after%-write", bad, coll)
  end)

  it("tostring of a tensor read before w:wait() is reported at the tostring's line", function()
    local x, out = tp.ones { 8, 2 }, tp.empty { 8 * tp.size, 2 }     -- more than 6 rows: a preview
    local coll = next_line()
    local w = g:all_gather(out, x, { async = true })
    local unrelated = tp.zeros { 1 }
    local bad = next_line()
    local text = tostring(out)
    w:wait()
    expect_report("read%-after%-write", bad, coll)
  end)

  it("a collective inside g:batch is reported at its own line, not the batch's last call", function()
    local a, b = tp.ones { 4 }, tp.ones { 8 }
    local coll
    local w = g:batch(function()
      coll = next_line()
      g:all_reduce(a)
      g:all_reduce(b)
      local unrelated = tp.zeros { 2 }
    end, { async = true })
    local bad = next_line()
    local y = a * 2
    w:wait()
    expect_report("read%-after%-write", bad, coll)
  end)

  it("names an in-place all_gather's output by its own shape", function()
    local out = tp.zeros { 4 * tp.size, 2 }
    local coll = next_line()
    local w = g:all_gather(out, out:chunk(tp.size, 1)[tp.rank + 1], { async = true })
    local bad = next_line()
    local s = out:sum()
    w:wait()
    expect_report("read%-after%-write", bad, coll)
    assert.truthy(tp.check.reports()[1].shape:find(("[%d, 2]"):format(4 * tp.size), 1, true),
      tp.check.reports()[1].shape)
  end)

  it("overwrites an async all_gather's input before w:wait()", function()
    local x = tp.ones { 8 }
    local out = tp.empty { 8 * tp.size }
    local coll = next_line()
    local w = g:all_gather(out, x, { async = true })
    local bad = next_line()
    x:fill_(3)
    w:wait()
    expect_report("write%-after%-read", bad, coll)
  end)

  -- A side stream writes x after the current stream's work; the host reads it, waiting for the current
  -- stream only: a report at the read unless `between(side)` (run before it) ordered the host after side.
  local function host_read_of_side_write(spin_ms, between)
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 1 }
    side:wait_stream(tp.current_stream())
    local w = next_line()
    tp.with_stream(side, function() tp.spin(spin_ms); x:fill_(7) end)
    if between and between(side) then side:synchronize(); return end
    local bad = next_line()
    local v = x:item()
    expect_report("host read", bad, w)
    side:synchronize()
  end

  it("reads on the host what a side stream wrote (item waits for the current stream only)", function()
    host_read_of_side_write(10)
  end)

  it("an event query that says not done leaves the host unordered (stream.c could join on any answer)", function()
    -- a host stalled past the spin sees the event done, which does order it: nothing to test then
    host_read_of_side_write(300, function(side) return tp.event():record(side):query() end)
  end)

  it("frees a tensor that a side stream still reads, with no record_stream", function()
    local side = tp.stream { name = "side" }
    local x = tp.ones { 128 }
    side:wait_stream(tp.current_stream())
    local r = next_line()
    local y = tp.with_stream(side, function() tp.spin(10); return x * 1 end)
    local bad = next_line()
    x:free()
    expect_report("free while in use", bad, r)
    local msg = tp.check.reports()[1].message
    assert.truthy(msg:find("allocator kept the memory safe", 1, true), msg)
  end)

  it("records the event before the write it should cover", function()
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 64 }
    local e = tp.event()
    e:record()
    local w = next_line()
    x:fill_(1)
    side:wait_event(e)
    local bad = next_line()
    local y = tp.with_stream(side, function() return x + 1 end)
    expect_report("read%-after%-write", bad, w)
  end)

  it("waits for the Work on another stream than the one that reads", function()
    local other = tp.stream { name = "other" }
    local x = tp.ones { 16 }
    local coll = next_line()
    local w = g:all_reduce(x, { async = true })
    w:wait(other)
    local bad = next_line()
    local y = x + 1
    expect_report("read%-after%-write", bad, coll)
  end)

  it("reads the output of a collective on an explicit stream without waiting", function()
    local s = tp.stream { name = "mine" }
    local x = tp.ones { 16 }
    local coll = next_line()
    local w = g:all_reduce(x, { stream = s })
    local bad = next_line()
    local v = x:sum()
    expect_report("read%-after%-write", bad, coll)
  end)

  it("reads a whole tensor while a side stream writes one of its chunks", function()
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 4, 16 }
    local parts = x:chunk(4, 1)
    side:wait_stream(tp.current_stream())
    local w = next_line()
    tp.with_stream(side, function() parts[3]:fill_(1) end)
    local bad = next_line()
    local s = x:sum()
    expect_report("read%-after%-write", bad, w)
  end)

  it("reads an async batch's output without waiting", function()
    local x, y = tp.ones { 8 }, tp.ones { 4 }
    local coll = next_line()
    local w = g:batch(function() g:all_reduce(x); g:broadcast(y, 0) end, { async = true })
    local bad = next_line()
    local z = x * 3
    w:wait()
    expect_report("read%-after%-write", bad, coll)
  end)

  it("an op in g:batch's function on a buffer of a collective recorded before it (it runs first)", function()
    -- g:batch issues its collectives when the function returns: the add ran before the sum (ordered on
    -- one stream, so no race was reported)
    local t = tp.ones { 4 }
    local bad
    g:batch(function()
      g:all_reduce(t)
      bad = next_line()
      t:add_(1)
    end)
    expect_report("op run ahead of a batched collective", bad)
    assert.are.equal(2 * tp.size, t:totable()[1])
  end)

  it("another group's collective in g:batch's function on a buffer of the batch (it runs first)", function()
    -- it is issued at once, the batch's own all_reduce when the function returns
    local g2 = g:split(0)
    local t = tp.ones { 4 }
    local bad
    g:batch(function()
      g:all_reduce(t)
      bad = next_line()
      g2:all_reduce(t, { op = "max" })
    end)
    expect_report("op run ahead of a batched collective", bad)
  end)

  it("strict mode makes the first report an error at its line", function()
    tp.check.strict(true)
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 8 }
    x:fill_(1)
    local bad = next_line()
    local ok, err = pcall(function() return tp.with_stream(side, function() return x + 1 end) end)
    tp.check.strict(false)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("read%-after%-write"), tostring(err))
    assert.truthy(tostring(err):find("check_spec.lua:" .. bad, 1, true), tostring(err))
  end)


  it("strict mode raises the report it makes, once, for an in-place op's race", function()
    -- t:add_(1) reads and writes t: its read reports the race with the fill_, and the call is refused
    -- there; its write's repeat of the pair used to be raised instead (write-after-write) while the
    -- read-after-write was the report recorded (audit, 2026-12-01)
    tp.check.strict(true)
    local side = tp.stream { name = "side" }
    local t = tp.empty { 64 }
    t:fill_(1)
    local ok, err = pcall(function() tp.with_stream(side, function() t:add_(1) end) end)
    tp.check.strict(false)
    assert.is_false(ok)
    local rs = tp.check.reports()
    assert.are.equal(1, #rs, describe_reports(rs))
    assert.are.equal("read-after-write race", rs[1].kind)
    assert.truthy(tostring(err):find(rs[1].message, 1, true), tostring(err))
    tp.check.clear()
  end)
  it("strict mode raises again when a caught race is made again", function()
    tp.check.strict(true)
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 8 }
    local raised = 0
    for i = 1, 3 do
      x:fill_(i)
      local ok = pcall(function() return tp.with_stream(side, function() return x + 1 end) end)
      if not ok then raised = raised + 1 end
      tp.synchronize()
    end
    tp.check.strict(false)
    assert.are.equal(3, raised)
  end)

  it("strict mode raises again when a refused op is retried against the same race", function()
    -- The refused op never runs: its accesses must not enter the history, where they would supersede
    -- the racing write and hide the race from the retry.
    tp.check.strict(true)
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 8 }
    tp.synchronize()
    tp.with_stream(side, function() x:fill_(1) end)
    local raised = 0
    for _ = 1, 3 do
      if not pcall(function() return x:add_(1) end) then raised = raised + 1 end
    end
    tp.check.strict(false)
    tp.synchronize()
    assert.are.equal(3, raised)
  end)

  it("reports each race once, however often it happens", function()
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 8 }
    for i = 1, 5 do
      x:fill_(i)
      tp.with_stream(side, function() return x + 1 end)
    end
    tp.synchronize()
    -- the read races with the fill before it, and the next fill with that read: two races, 5 times
    local rs = tp.check.reports()
    assert.are.equal(2, #rs, describe_reports(rs))
    assert.truthy(rs[1].kind:find("read%-after%-write"))
    assert.truthy(rs[2].kind:find("write%-after%-read"))
  end)
end)

describe("stream sanitizer: correct schedules give no report", function()
  before_each(check_on)
  after_each(check_off)

  it("a side stream waits for an event recorded after the write", function()
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 256 }
    x:fill_(1)
    local e = tp.event()
    e:record()
    side:wait_event(e)
    local y = tp.with_stream(side, function() return x * 2 end)
    tp.current_stream():wait_stream(side)
    assert.are.equal(512, y:sum():item())
    expect_none()
  end)

  it("a tensor allocated on one stream and used on another that waited after the allocation", function()
    local side = tp.stream { name = "side" }
    local out = tp.empty { 256 }
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() out:fill_(5) end)
    local mine = tp.with_stream(side, function() local t = tp.empty { 256 }; t:fill_(2); return t end)
    tp.current_stream():wait_stream(side)
    assert.are.equal(7 * 256, (out + mine):sum():item())
    expect_none()
  end)

  it("wait_stream in both directions around a side computation", function()
    local side = tp.stream { name = "side" }
    local x = tp.ones { 64 }
    side:wait_stream(tp.current_stream())
    local y = tp.with_stream(side, function() return x + 1 end)
    tp.current_stream():wait_stream(side)
    x:fill_(0)
    assert.are.equal(128, y:sum():item())
    expect_none()
  end)

  it("an async all_reduce read after w:wait()", function()
    local x = tp.ones { 32 }
    local w = g:all_reduce(x, { async = true })
    w:wait()
    assert.are.equal(32 * tp.size, x:sum():item())
    expect_none()
  end)

  it("an async all_gather read on the host after w:block()", function()
    local x = tp.full({ 4 }, tp.rank)
    local out = tp.empty { 4 * tp.size }
    local w = g:all_gather(out, x, { async = true })
    w:block()
    local t = out:totable()
    assert.are.equal(tp.size - 1, t[#t])
    expect_none()
  end)

  it("collectives on the current stream are ordered like any op", function()
    local x = tp.ones { 16 }
    g:all_reduce(x)
    x:mul_(2)
    local out = tp.empty { 16 * tp.size }
    g:all_gather(out, x)
    assert.are.equal(2 * tp.size * 16 * tp.size, out:sum():item())
    expect_none()
  end)

  it("ops in g:batch's function before its collectives, or reading what they only read", function()
    local t, x, out = tp.ones { 4 }, tp.ones { 4 }, tp.empty { 4 * tp.size }
    g:batch(function()
      t:add_(1)
      g:all_reduce(t)
      g:all_gather(out, x)
      local y = x * 2
    end)
    expect_none()
  end)

  it("two streams write disjoint chunks of one tensor, then join", function()
    local a, b = tp.stream { name = "a" }, tp.stream { name = "b" }
    local x = tp.zeros { 2, 32 }
    local p = x:chunk(2, 1)
    a:wait_stream(tp.current_stream())
    b:wait_stream(tp.current_stream())
    tp.with_stream(a, function() p[1]:fill_(1) end)
    tp.with_stream(b, function() p[2]:fill_(2) end)
    tp.current_stream():wait_stream(a)
    tp.current_stream():wait_stream(b)
    assert.are.equal(96, x:sum():item())
    expect_none()
  end)

  it("tp.synchronize orders a side stream's write before later work anywhere", function()
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 8 }
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() x:fill_(3) end)
    tp.synchronize()
    assert.are.equal(24, x:sum():item())
    expect_none()
  end)

  it("record_stream covers a free while a side stream reads", function()
    local side = tp.stream { name = "side" }
    local x = tp.ones { 128 }
    side:wait_stream(tp.current_stream())
    local y = tp.with_stream(side, function() return x * 1 end)
    x:record_stream(side)
    x:free()
    side:synchronize()
    expect_none()
  end)

  it("record_stream covers a free on ten side streams", function()
    -- the shadow names 8 streams; past them every stream counts as named, not the tenth as missing
    local x, sides, ys = tp.ones { 128 }, {}, {}
    for i = 1, 10 do
      sides[i] = tp.stream { name = "rs" .. i }
      sides[i]:wait_stream(tp.current_stream())
      ys[i] = tp.with_stream(sides[i], function() return x * 1 end)
      x:record_stream(sides[i])
    end
    x:free()
    tp.synchronize()
    expect_none()
  end)

  it("tensors of collectives dropped with their Works unwaited need no record_stream (the Work keeps them)", function()
    -- API.md: a Work keeps its tensors until it is waited on or completed, so a caller never needs
    -- record_stream for them. Check mode's Works are Lua tables that die with their tensors, and the
    -- free was reported against the collective's own accesses, advising t:record_stream(comm0).
    do
      local outs = {}
      for i = 1, tp.size do outs[i] = tp.empty { 64 } end
      g:all_gather(outs, tp.ones { 64 }, { async = true })       -- list form: its copies too
      g:broadcast(tp.full({ 64 }, 7), { root = 0, async = true })
      local x = tp.ones { 64 }
      g:all_reduce(x, { async = true }):wait(tp.stream { name = "elsewhere" })
    end
    collectgarbage()
    collectgarbage()
    expect_none()
  end)

  it("polling w:is_completed() orders the host after the collective", function()
    local x = tp.ones { 8 }
    local w = g:all_reduce(x, { async = true })
    while not w:is_completed() do end
    assert.are.equal(8 * tp.size, x:sum():item())
    expect_none()
  end)

  it("side:synchronize() then a host read of what side wrote", function()
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 1 }
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() x:fill_(9) end)
    side:synchronize()
    assert.are.equal(9, x:item())
    expect_none()
  end)

  it("a stream's own ops are always ordered", function()
    local side = tp.stream { name = "side" }
    local v = tp.with_stream(side, function()
      local x = tp.ones { 16 }
      local y = x * 3
      x:fill_(2)
      return (y + x):sum():item()
    end)
    assert.are.equal(80, v)
    expect_none()
  end)

  it("a host read of a tensor that a side stream still reads (two reads never race)", function()
    local side = tp.stream { name = "side" }
    local x = tp.full({ 256 }, 2)
    side:wait_stream(tp.current_stream())
    local y = tp.with_stream(side, function() tp.spin(20); return x * 3 end)
    assert.are.equal(2, x:totable()[256])
    expect_none()
  end)

  it("a stream query that says done orders the host after that stream", function()
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 4 }
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() x:fill_(1) end)
    while not side:query() do end
    assert.are.same({ 1, 1, 1, 1 }, x:totable())
    expect_none()
  end)

  it("an event query that says done orders the host after it", function()
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 4 }
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() x:fill_(1) end)
    local e = tp.event()
    e:record(side)
    while not e:query() do end
    local y = x + 1
    assert.are.equal(8, y:sum():item())
    expect_none()
  end)

  it("list all_gather and reduce_scatter on the comm stream, waited for", function()
    local x = tp.full({ 4 }, tp.rank + 1)
    local outs = {}
    for i = 1, tp.size do outs[i] = tp.empty { 4 } end
    local w = g:all_gather(outs, x, { async = true })
    w:wait()
    local big = tp.ones { 4 * tp.size }
    local part = tp.empty { 4 }
    g:reduce_scatter(part, big, { async = true }):wait()
    assert.are.equal(4 * tp.size, part:sum():item())
    assert.are.equal(4 * tp.size, outs[tp.size]:sum():item())
    expect_none()
  end)

  it("check mode off records nothing", function()
    tp.check.enable(false)
    local side = tp.stream { name = "side" }
    local x = tp.zeros { 8 }
    x:fill_(1)
    tp.with_stream(side, function() return x + 1 end)
    tp.synchronize()
    assert.are.equal(0, #tp.check.reports())
    tp.check.enable(true)
  end)
end)

describe("check mode's switches", function()
  it("take true, false or nothing, and refuse anything else", function()
    local was = tp.check.enabled()
    for _, bad in ipairs { "yes", 1, {} } do
      local ok, err = pcall(tp.check.enable, bad)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("tp.check.enable: expected true, false or nothing, got", 1, true), tostring(err))
      ok, err = pcall(tp.check.strict, bad)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("tp.check.strict: expected true, false or nothing, got", 1, true), tostring(err))
    end
    assert.are.equal(was, tp.check.enabled())
  end)

  it("turn on when called with nothing, and the watchdog's timeout takes seconds > 0 only", function()
    local was, was_timeout = tp.check.enabled(), tp.check.timeout()
    tp.check.enable(false)
    tp.check.enable()
    assert.is_true(tp.check.enabled())
    tp.check.strict()
    assert.is_true(tp.check.is_strict())
    tp.check.strict(false)
    tp.check.enable(was)
    assert.has_error(function() tp.check.timeout(0) end, "tp.check.timeout: expected a finite number of seconds > 0, got 0")
    assert.are.equal(123, tp.check.timeout(123))
    tp.check.timeout(was_timeout)
  end)

  it("strict mode lets a free that makes no report pass, and the runner's marks count from a clear", function()
    check_on()
    tp.check.strict(true)
    local x = tp.ones { 4 }
    tp.synchronize()
    local ok, err = pcall(x.free, x)
    tp.check.strict(false)
    assert.is_true(ok, tostring(err))
    -- a report, a mark after it, a clear, and the same race again: the mark's count belongs to the
    -- reports before the clear, so the one made since is counted from the start
    local side = tp.stream { name = "side" }
    local function race()
      local y = tp.zeros { 256 }
      tp.spin(20)
      y:fill_(1)
      tp.with_stream(side, function() return y * 2 end)
      tp.synchronize()
    end
    race()
    local mark = tp.check._mark()
    assert.are.equal(1, mark.n)
    tp.check.clear()
    race()
    assert.are.equal(1, #tp.check._since(mark))
    tp.check.clear()
    check_off()
  end)
end)

describe("collective mismatch check (check mode)", function()
  before_each(check_on)
  after_each(check_off)

  it("different collectives raise on every rank, naming the ranks and what each passed", function()
    if tp.size < 2 then return pending("needs 2 ranks") end
    local x = tp.ones { 4 }
    local ok, err = pcall(function()
      if tp.rank == 0 then g:all_reduce(x) else g:broadcast(x, 0) end
    end)
    assert.is_false(ok)
    err = tostring(err)
    assert.truthy(err:find("collective mismatch", 1, true), err)
    assert.truthy(err:find("rank 0: all_reduce(f32, 4 elements, op=sum)", 1, true), err)
    local rest = {}
    for r = 1, tp.size - 1 do rest[#rest + 1] = tostring(r) end
    local others = (#rest == 1 and "rank " or "ranks ") .. table.concat(rest, ", ") .. ": "
    assert.truthy(err:find(others .. "broadcast(f32, 4 elements, root=0)", 1, true), err)
    assert.falsy(err:find("as collective #", 1, true), err)   -- every rank's is #0 of the group
    -- nothing was enqueued: the group goes on with matching calls
    g:all_reduce(x)
    assert.are.equal(4 * tp.size, x:sum():item())
  end)

  it("numbers the collective from 0, as the watchdog and the runner do", function()
    if tp.size < 2 then return pending("needs 2 ranks") end
    local ranks = {}
    for r = 0, tp.size - 1 do ranks[#ranks + 1] = r end
    local h = tp.new_group(ranks)            -- a fresh group: its first collective is #0
    local x = tp.ones { 4 }
    local ok, err = pcall(function()
      if tp.rank == 0 then h:all_reduce(x) else h:broadcast(x, 0) end
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("(collective #0 of the group, counted from 0", 1, true), tostring(err))
    h:all_reduce(x)
    ok, err = pcall(function()
      if tp.rank == 0 then h:all_gather(tp.empty { 4 * tp.size }, x) else h:all_reduce(x) end
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("(collective #1 of the group, counted from 0", 1, true), tostring(err))
  end)

  it("different element counts, dtypes, roots and reduce ops are mismatches", function()
    if tp.size < 2 then return pending("needs 2 ranks") end
    local cases = {
      function() return g:all_reduce(tp.ones { tp.rank == 1 and 5 or 4 }) end,
      function() return g:all_reduce(tp.ones({ 4 }, tp.rank == 1 and "f64" or "f32")) end,
      function() return g:broadcast(tp.ones { 4 }, tp.rank == 1 and 1 or 0) end,
      function() return g:all_reduce(tp.ones { 4 }, { op = tp.rank == 1 and "max" or "sum" }) end,
      -- reduce has a root and an op, reduce_scatter an op (coll_match.c has_root and has_op)
      function() return g:reduce(tp.ones { 4 }, { root = tp.rank == 1 and 1 or 0 }) end,
      function() return g:reduce(tp.ones { 4 }, { op = tp.rank == 1 and "max" or "sum" }) end,
      function()
        return g:reduce_scatter(tp.empty { 2 }, tp.ones { 2 * tp.size }, { op = tp.rank == 1 and "max" or "sum" })
      end,
    }
    for i, case in ipairs(cases) do
      local ok, err = pcall(case)
      assert.is_false(ok, "case " .. i .. " passed")
      assert.truthy(tostring(err):find("collective mismatch", 1, true), tostring(err))
      assert.truthy(tostring(err):find("rank 1: ", 1, true), tostring(err))
    end
  end)

  it("says which collective of the group each rank's is where their counts differ", function()
    if tp.size < 2 then return pending("needs 2 ranks") end
    local ranks = {}
    for r = 0, tp.size - 1 do ranks[#ranks + 1] = r end
    local h = tp.new_group(ranks)
    local a, b = tp.ones { 4 }, tp.ones { 4 }
    -- rank 0 issues one collective unchecked: its count of h's collectives runs one ahead
    tp.check.enable(false)
    if tp.rank == 0 then h:all_reduce(a) end
    tp.check.enable(true)
    local ok, err = pcall(function() h:all_reduce(b) end)
    assert.is_false(ok)
    err = tostring(err)
    if tp.rank == 0 then
      local rest = {}
      for r = 1, tp.size - 1 do rest[#rest + 1] = tostring(r) end
      assert.truthy(err:find("(collective #1 of the group", 1, true), err)
      assert.truthy(err:find((#rest == 1 and "rank " or "ranks ") .. table.concat(rest, ", ") ..
        ": all_reduce(f32, 4 elements, op=sum) as collective #0", 1, true), err)
    else
      assert.truthy(err:find("(collective #0 of the group", 1, true), err)
      assert.truthy(err:find("rank 0: all_reduce(f32, 4 elements, op=sum) as collective #1", 1, true), err)
    end
    -- the others pair with rank 0's unchecked call; then the counts agree again
    tp.check.enable(false)
    if tp.rank ~= 0 then h:all_reduce(a) end
    tp.check.enable(true)
    h:all_reduce(b)
    assert.are.equal(4 * tp.size, a:sum():item())
    assert.are.equal(4 * tp.size, b:sum():item())
  end)

  it("numbers a batch's collectives one by one, to meet single calls, and names a mismatch's place in the batch",
    function()
    if tp.size < 2 then return pending("needs 2 ranks") end
    local x, y = tp.ones { 4 }, tp.ones { 3 }
    local function calls() g:all_reduce(x); g:all_reduce(y, { op = "max" }) end
    if tp.rank == 0 then g:batch(calls) else calls() end
    assert.are.equal(4 * tp.size, x:sum():item())
    assert.are.equal(3, y:sum():item())
    -- the batch's second differs: the others' first single call is issued, nothing of the batch is
    local ok, err = pcall(function()
      if tp.rank == 0 then g:batch(function() g:all_reduce(x); g:all_reduce(y) end)
      else g:all_reduce(x); g:all_reduce(y, { op = "max" }) end
    end)
    assert.is_false(ok)
    err = tostring(err)
    assert.truthy(err:find("collective mismatch", 1, true), err)
    if tp.rank == 0 then
      assert.truthy(err:find("(collective 2 of this rank's batch of 2: none of it was issued)", 1, true), err)
    end
    tp.check.enable(false)
    if tp.rank == 0 then g:all_reduce(x) end           -- pairs with the others' single call
    tp.check.enable(true)
    assert.are.equal(4 * tp.size * tp.size, x:sum():item())
  end)

  it("a rank that skipped a collective is caught at the next one", function()
    if tp.size < 2 then return pending("needs 2 ranks") end
    local sub = g:split(0, tp.rank)          -- a fresh group: its own numbering
    local x = tp.ones { 4 }
    local ok, err = pcall(function()
      if tp.rank ~= 1 then sub:all_reduce(x) end
      sub:all_gather(tp.empty { 4 * tp.size }, x)
    end)
    assert.is_false(ok)
    err = tostring(err)
    local joined = { "0" }
    for r = 2, tp.size - 1 do joined[#joined + 1] = tostring(r) end
    local who = (#joined == 1 and "rank " or "ranks ") .. table.concat(joined, ", ")
    assert.truthy(err:find(who .. ": all_reduce", 1, true), err)
    assert.truthy(err:find("rank 1: all_gather", 1, true), err)
  end)

  it("a receive of another count or dtype than its peer sends is refused on the receiving rank", function()
    if tp.size < 2 then return pending("needs 2 ranks") end
    if tp.rank > 1 then return end
    local x = tp.ones { 4 }
    if tp.rank == 0 then
      g:send(x, 1)
    else
      local ok, err = pcall(function() g:recv(tp.empty { 8 }, 0) end)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("group:recv: send/recv mismatch on group " .. g.id ..
        ": rank 0 sends f32 x 4 elements to rank 1, which receives f32 x 8 elements", 1, true), tostring(err))
      -- nothing was enqueued here; rank 0's send is out there: receive it as sent, unchecked (the check's
      -- message for it was read by the refused call)
      local on = tp.check.enabled()
      tp.check.enable(false)
      local y = tp.empty { 4 }
      g:recv(y, 0)
      assert.are.equal(4, y:sum():item())
      tp.check.enable(on)
    end
  end)

  it("matching collectives and point-to-point pass", function()
    local x = tp.ones { 4 }
    g:all_reduce(x)
    g:broadcast(x, 0)
    if tp.size >= 2 and tp.rank < 2 then
      local peer = 1 - tp.rank
      g:batch(function() g:send(x, peer); g:recv(tp.empty { 4 }, peer) end)
    end
    g:all_reduce(x, { op = "max" })
    assert.are.equal(4 * tp.size, x:sum():item())
  end)
end)
