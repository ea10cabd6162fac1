-- Chaos mode (tp.chaos, --chaos[=SEED], TPSH_CHAOS; src/core/chaos.c): every race of the sanitizer's
-- corpus (check_spec.lua, check_streams_spec.lua), written as a schedule that nobody checks and that reads
-- its own result, gives a wrong result under chaos alone for one of the seeds 1-8, on some rank, and
-- again in a second run of that seed; correct schedules give the right result under every seed of 1-8.
-- Check mode is off while a race runs (the suite runs once with --check, which would report it). The
-- sanitizer's cases of g:batch's function running ahead of the batch are no races (the order is fixed,
-- chaos or not), and a free that the allocator keeps safe is a correct schedule here.
local g = tp.world
local EXE = os.getenv("TPSH_EXE")

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local child = dofile(here .. "support/child_job.lua")

local function any_rank(v)
  for _, x in ipairs(tp.allgather(v)) do if x then return true end end
  return false
end

-- fn() with check mode off (restored after, also on error)
local function unchecked(fn)
  local was = tp.check.enabled()
  if was then tp.check.enable(false) end
  local ok, err = pcall(fn)
  if was then tp.check.enable(true) end
  if not ok then error(err, 0) end
end

-- schedule() under chaos with seed; it returns (result, expected): result a tensor (its sum is
-- compared, once every stream is done) or a number it read itself. Whether it was wrong on this rank.
local function wrong_here(schedule, seed)
  local got, want = tp.chaos(seed, function()
    local r, want = schedule()
    tp.synchronize()
    return r, want
  end)
  if tp.is_tensor(got) then got = got:sum():item() end
  return got ~= want
end

-- ... on any rank
local function wrong_with(schedule, seed) return any_rank(wrong_here(schedule, seed)) end

-- The first seed of 1-8 whose two runs both give a wrong result, or nil.
local function reproducible_seed(schedule)
  for seed = 1, 8 do
    if wrong_with(schedule, seed) and wrong_with(schedule, seed) then return seed end
  end
end

-- it(...) for a race: `ranks` the fewest ranks on which it changes a value (an all_reduce of one rank is
-- its input, whenever it runs); `caching`: it needs the caching allocator's reuse of a block.
local function race(name, schedule, ranks, caching)
  it(name, function()
    if tp.size < (ranks or 1) then return pending(("needs %d ranks"):format(ranks)) end
    if caching and not tp.memory_stats().caching then return pending("TPSH_NO_MEMORY_CACHING=1: no block is reused") end
    unchecked(function()
      local seed = reproducible_seed(schedule)
      assert.truthy(seed, "no seed of 1-8 gave a wrong result twice")
    end)
  end)
end

local function side_stream(name) return tp.stream { name = name or "side" } end

-- two side streams "a" and "b", each ordered after the current stream's work so far
local function two_sides()
  local a, b = side_stream("a"), side_stream("b")
  a:wait_stream(tp.current_stream())
  b:wait_stream(tp.current_stream())
  return a, b
end

describe("chaos mode: every race of the sanitizer's corpus gives a wrong result, again with its seed", function()
  race("a side stream reads what the default stream writes (read after write)", function()
    local side = side_stream()
    local x = tp.zeros { 256 }
    x:fill_(1)
    local y = tp.with_stream(side, function() return x * 2 end)
    return y, 512
  end)

  race("a side stream fills a new tensor whose cached block the default stream still reads", function()
    local side = side_stream()
    local x = tp.ones { 3333 }
    tp.synchronize()                     -- x written before: the race is of its read with the side's write
    local y = x * 2
    x:free()
    local z = tp.empty { 3333 }          -- x's block, from the cache (a use-after-free on the side stream)
    tp.with_stream(side, function() z:fill_(5) end)
    return y, 2 * 3333
  end, 1, true)

  race("the default stream overwrites what a side stream still reads (write after read)", function()
    local side = side_stream()
    local x = tp.ones { 256 }
    side:wait_stream(tp.current_stream())
    local y = tp.with_stream(side, function() return x + 1 end)
    x:fill_(5)
    return y, 512
  end)

  race("overwrites what two side streams read after waiting for one of them", function()
    local x = tp.ones { 64 }
    local a, b = two_sides()
    local ya = tp.with_stream(a, function() return x + 1 end)
    local yb = tp.with_stream(b, function() return x + 2 end)
    tp.current_stream():wait_stream(b)
    x:fill_(5)
    return ya, 128
  end)

  race("two streams write one tensor (write after write)", function()
    local x = tp.zeros { 64 }
    local a, b = two_sides()
    tp.with_stream(a, function() x:fill_(1) end)
    tp.with_stream(b, function() x:fill_(2) end)
    return x, 128
  end)

  race("a race between two side streams (check_streams_spec's, on streams of their own)", function()
    local x = tp.zeros { 256 }
    local a, b = two_sides()
    tp.with_stream(a, function() x:fill_(1) end)
    local y = tp.with_stream(b, function() return x * 2 end)
    return y, 512
  end)

  race("reads an async all_reduce's output without w:wait()", function()
    local x = tp.ones { 32 }
    local w = g:all_reduce(x, { async = true })
    local y = x * 2
    w:wait()
    return y, 64 * tp.size
  end, 2)

  race("reads an async all_gather's output without w:wait()", function()
    local x = tp.ones { 8 }
    local out = tp.full({ 8 * tp.size }, -1)
    local w = g:all_gather(out, x, { async = true })
    local s = out:sum()
    w:wait()
    return s, 8 * tp.size
  end)

  race("adds in place to an async all_reduce's tensor before w:wait()", function()
    local t = tp.ones { 8 }
    local w = g:all_reduce(t, { async = true })
    t:add_(1)
    w:wait()
    return t, 8 * (tp.size + 1)
  end, 2)

  race("reads a list all_gather's output in an async g:batch without w:wait()", function()
    local x, other = tp.ones { 8 }, tp.ones { 8 }
    local outs = {}
    for i = 1, tp.size do outs[i] = tp.full({ 8 }, -1) end
    local w = g:batch(function()
      g:all_gather(outs, x)
      local y = other * 2
    end, { async = true })
    local s = outs[1]:sum()
    w:wait()
    return s, 8
  end)

  race("tostring of a tensor read before w:wait()", function()
    local x, out = tp.ones { 8, 2 }, tp.full({ 8 * tp.size, 2 }, -1)
    local w = g:all_gather(out, x, { async = true })
    local text = tostring(out)
    w:wait()
    return text:find("-1", 1, true) and 1 or 0, 0
  end)

  race("reads an all_reduce of an async g:batch without w:wait()", function()
    local a, b = tp.ones { 4 }, tp.ones { 8 }
    local w = g:batch(function()
      g:all_reduce(a)
      g:all_reduce(b)
    end, { async = true })
    local y = a * 2
    w:wait()
    return y, 8 * tp.size
  end, 2)

  race("reads an in-place all_gather's output without w:wait()", function()
    local out = tp.full({ 4 * tp.size, 2 }, -1)
    local mine = out:chunk(tp.size, 1)[tp.rank + 1]
    mine:fill_(1)
    local w = g:all_gather(out, mine, { async = true })
    local s = out:sum()
    w:wait()
    return s, 8 * tp.size
  end, 2)

  race("overwrites an async all_gather's input before w:wait()", function()
    local x = tp.ones { 8 }
    local out = tp.full({ 8 * tp.size }, -1)
    local w = g:all_gather(out, x, { async = true })
    x:fill_(3)
    w:wait()
    return out, 8 * tp.size
  end)

  race("reads on the host what a side stream wrote (item waits for the current stream only)", function()
    local side = side_stream()
    local x = tp.zeros { 1 }
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() x:fill_(7) end)
    return x:item(), 7
  end)

  race("reads on the host what a side stream wrote after an event query said not done", function()
    local side = side_stream()
    local x = tp.zeros { 1 }
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() x:fill_(7) end)
    if tp.event():record(side):query() then side:synchronize() end      -- done: ordered, no race
    return x:item(), 7
  end)

  race("records the event before the write it should cover", function()
    local side = side_stream()
    local x = tp.zeros { 64 }
    local e = tp.event()
    e:record()
    x:fill_(1)
    side:wait_event(e)
    local y = tp.with_stream(side, function() return x + 1 end)
    return y, 128
  end)

  race("waits for the Work on another stream than the one that reads", function()
    local other = side_stream("other")
    local x = tp.ones { 16 }
    local out = tp.full({ 16 * tp.size }, -1)
    local w = g:all_gather(out, x, { async = true })
    w:wait(other)
    local y = out + 1
    return y, 32 * tp.size
  end)

  race("reads the output of a collective on an explicit stream without waiting", function()
    local s = side_stream("mine")
    local x = tp.ones { 16 }
    local out = tp.full({ 16 * tp.size }, -1)
    g:all_gather(out, x, { stream = s })
    local v = out:sum()
    return v, 16 * tp.size
  end)

  race("reads a whole tensor while a side stream writes one of its chunks", function()
    local side = side_stream()
    local x = tp.zeros { 4, 16 }
    local parts = x:chunk(4, 1)
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() parts[3]:fill_(1) end)
    local s = x:sum()
    return s, 16
  end)

  race("reads an async batch's output without waiting", function()
    local x, y = tp.ones { 8 }, tp.ones { 4 }
    local w = g:batch(function() g:all_reduce(x); g:broadcast(y, 0) end, { async = true })
    local z = x * 3
    w:wait()
    return z, 24 * tp.size
  end, 2)
end)

local SEEDS_CORRECT = 8

describe("chaos mode: correct schedules give the right result under every seed", function()
  local correct = {
    ["a side stream waits for an event recorded after the write"] = function()
      local side = side_stream()
      local x = tp.zeros { 256 }
      x:fill_(1)
      local e = tp.event()
      e:record()
      side:wait_event(e)
      local y = tp.with_stream(side, function() return x * 2 end)
      tp.current_stream():wait_stream(side)
      return y, 512
    end,
    ["wait_stream in both directions around a side computation"] = function()
      local side = side_stream()
      local x = tp.ones { 64 }
      side:wait_stream(tp.current_stream())
      local y = tp.with_stream(side, function() return x + 1 end)
      tp.current_stream():wait_stream(side)
      x:fill_(0)
      return y, 128
    end,
    ["an async all_gather read after w:wait(), its input overwritten after"] = function()
      local x = tp.ones { 8 }
      local out = tp.full({ 8 * tp.size }, -1)
      local w = g:all_gather(out, x, { async = true })
      w:wait()
      x:fill_(3)
      return out:sum(), 8 * tp.size
    end,
    ["an async all_reduce read on the host after w:block()"] = function()
      local x = tp.ones { 32 }
      g:all_reduce(x, { async = true }):block()
      return x:totable()[32], tp.size
    end,
    ["two streams write disjoint chunks of one tensor, then join"] = function()
      local x = tp.zeros { 2, 32 }
      local p = x:chunk(2, 1)
      local a, b = two_sides()
      tp.with_stream(a, function() p[1]:fill_(1) end)
      tp.with_stream(b, function() p[2]:fill_(2) end)
      tp.current_stream():wait_stream(a)
      tp.current_stream():wait_stream(b)
      return x:sum(), 96
    end,
    ["a tensor freed while a side stream reads it, its block reused at once (the allocator keeps it safe)"] = function()
      local side = side_stream()
      local x = tp.ones { 128 }
      side:wait_stream(tp.current_stream())
      local y = tp.with_stream(side, function() return x * 1 end)
      x:free()
      local z = tp.empty { 128 }
      z:fill_(9)
      local zz = tp.with_stream(side, function() local t = tp.empty { 128 }; t:fill_(4); return t end)
      return y, 128
    end,
    ["a chain of collectives and ops on the comm stream and the current one, each waited for"] = function()
      local x = tp.full({ 16 }, tp.rank + 1)
      local out = tp.empty { 16 * tp.size }
      local w = g:all_reduce(x, { async = true })
      w:wait()
      x:mul_(2)
      w = g:all_gather(out, x, { async = true })
      local side = side_stream()
      side:wait_stream(tp.current_stream())
      local y = tp.with_stream(side, function() return tp.ones { 4 } end)
      w:wait()
      tp.current_stream():wait_stream(side)
      local n = tp.size
      return out:sum() + y:sum(), 16 * n * 2 * n * (n + 1) / 2 + 4
    end,
  }
  local names = {}
  for name in pairs(correct) do names[#names + 1] = name end
  table.sort(names)
  -- what the sanitizer reports though the allocator keeps it safe (check_spec's "frees a tensor that a
  -- side stream still reads"): run unchecked, as the races are
  local reported = { ["a tensor freed while a side stream reads it, its block reused at once (the allocator keeps it safe)"] = true }
  for _, name in ipairs(names) do
    it(name, function()
      local function each_seed()
        local wrong = {}
        for seed = 1, SEEDS_CORRECT do
          if wrong_here(correct[name], seed) then wrong[#wrong + 1] = seed end
        end
        local all = tp.allgather(table.concat(wrong, ", "))
        for r, w in ipairs(all) do assert.are.equal("", w, ("rank %d: wrong results with the seeds %s"):format(r - 1, w)) end
      end
      if reported[name] then unchecked(each_seed) else each_seed() end
    end)
  end
end)

describe("tp.chaos", function()
  it("draws the same delays for the same seed, others for another, none when off", function()
    local function schedule()
      local side = side_stream()
      local x = tp.ones { 64 }
      for _ = 1, 6 do x:add_(1) end
      side:wait_stream(tp.current_stream())
      tp.with_stream(side, function() for _ = 1, 6 do x:mul_(1) end end)
      tp.current_stream():wait_stream(side)
      g:all_reduce(x)
      tp.synchronize()
    end
    local function delays(seed)
      return tp.chaos(seed, function()
        schedule()
        local _, n, ms = tp.chaos()
        return { n, ms }
      end)
    end
    local a, b, c = delays(5), delays(5), delays(6)
    assert.is_true(a[1] > 0, "seed 5 made no delay")
    assert.are.same(a, b)
    assert.are_not.same(a, c)
    local was = tp.chaos(false)
    schedule()
    assert.is_nil(tp.chaos())
    if was then tp.chaos(was) end
  end)

  it("sets, returns the seed before, and restores it after a function, also on error", function()
    local was = tp.chaos(3)
    assert.are.equal(3, tp.chaos(4))
    assert.are.equal(4, (tp.chaos()))
    assert.are.equal(7, tp.chaos(9, function(a, b) assert.are.equal(9, (tp.chaos())); return a + b end, 3, 4))
    assert.are.equal(4, (tp.chaos()))
    local ok, err = pcall(tp.chaos, false, function() error("inside") end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("inside", 1, true), tostring(err))
    assert.are.equal(4, (tp.chaos()))
    tp.chaos(was or false)
  end)

  it("refuses what is no seed, naming the call", function()
    for _, bad in ipairs { 0, -1, 1.5, 2 ^ 53, "7", true, {} } do
      assert.has_error(function() tp.chaos(bad) end,
        "tp.chaos: expected a seed (an integer from 1 to 2^53 - 1) or false, got " ..
        (type(bad) == "number" and (bad == math.floor(bad) and bad < 2 ^ 53 and ("%d"):format(bad) or ("%.17g"):format(bad))
          or type(bad) == "string" and '"7"' or type(bad)))
    end
    assert.has_error(function() tp.chaos(3, 4) end, "tp.chaos: expected a function as argument 2, got number")
  end)
end)

describe("--chaos and TPSH_CHAOS", function()
  local function tpsh(args, env)
    return child.run((env or "") .. " OPENBLAS_NUM_THREADS=1 " .. child.quote(EXE) .. " --backend cpu " .. args .. " 2>&1", 60)
  end
  -- a racy script that checks its result: the read of an async all_gather's output before w:wait()
  local RACE = [[local x, out = tp.ones{8}, tp.full({8}, -1)
local w = tp.world:all_gather(out, x, {async = true})
local s = out:sum():item()
w:wait()
assert(s == 8, "read " .. s .. " before the all_gather wrote")]]

  it("--chaos=SEED reproduces a failure, which says its seed", function()
    if not EXE then return pending("needs TPSH_EXE") end
    local found
    for seed = 1, 8 do
      local r = tpsh("--chaos=" .. seed .. " -e " .. child.quote(RACE))
      if r.status ~= 0 then found = { seed, r }; break end
    end
    assert.truthy(found, "no seed of 1-8 failed the racy script")
    local seed, r = found[1], found[2]
    assert.truthy(r.output:find("[rank 0] tpsh: chaos seed " .. seed .. " (--chaos=" .. seed .. " gives the same", 1, true),
      r.output)
    assert.truthy(r.output:find("before the all_gather wrote", 1, true), r.output)
    local again = tpsh("--chaos=" .. seed .. " -e " .. child.quote(RACE))
    assert.are_not.equal(0, again.status, again.output)
  end)

  it("`tpsh test` starts each test's delays from the seed, and its failure says the seed", function()
    if not EXE then return pending("needs TPSH_EXE") end
    local r = tpsh("--chaos=9 test -o plain " .. child.quote(here .. "runner/chaos_fixture.lua"))
    assert.are.equal(1, r.status, r.output)
    local first, second = r.output:match("first: (%d+ delays, [%d.]+ ms)"), r.output:match("second: (%d+ delays, [%d.]+ ms)")
    assert.truthy(first and first:match("^[1-9]"), r.output)
    assert.are.equal(first, second)
    assert.truthy(r.output:find("2 passed, 1 failed", 1, true), r.output)
    assert.truthy(r.output:find("[rank 0] tpsh: chaos seed 9 (--chaos=9 gives the same delays again)", 1, true), r.output)
  end)

  it("--chaos alone draws a seed, which a failure says; TPSH_CHAOS sets one", function()
    if not EXE then return pending("needs TPSH_EXE") end
    local r = tpsh("--chaos -e " .. child.quote("print('seed', tp.chaos()); error('failed on purpose')"))
    assert.are_not.equal(0, r.status)
    local seed = r.output:match("seed\t(%d+)")
    assert.truthy(seed, r.output)
    assert.truthy(r.output:find("tpsh: chaos seed " .. seed .. " ", 1, true), r.output)
    r = tpsh("-e " .. child.quote("print('seed', tp.chaos())"), "TPSH_CHAOS=12345")
    assert.are.equal(0, r.status, r.output)
    assert.truthy(r.output:find("seed\t12345", 1, true), r.output)
    assert.falsy(r.output:find("chaos seed", 1, true), r.output)     -- said only when the run fails
    r = tpsh("-e ''", "TPSH_CHAOS=often")
    assert.are.equal(1, r.status)
    assert.truthy(r.output:find("TPSH_CHAOS expects a seed (an integer from 1 to 2^53 - 1), random, or 0 for off: often",
      1, true), r.output)
    r = tpsh("--chaos=0 -e ''")
    assert.are.equal(1, r.status)
    assert.truthy(r.output:find("--chaos=SEED expects a seed", 1, true), r.output)
  end)
end)
