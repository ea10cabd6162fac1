-- tp.graph: a function's device work captured once and replayed, against the same work run eagerly.
-- Runs on both backends (a CUDA graph on cuda, the recorded op list on the CPU) and under any
-- `mpiexec -n N`; small tensors only.
local n, r = tp.size, tp.rank

local function vals(t) return t:totable() end

-- The error of fn (it must raise), without its position.
local function error_of(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  return (tostring(err):gsub("^[^:\n]+:%d+: ", ""))
end

local function has(text, part) assert.is_truthy(text:find(part, 1, true), text) end

-- an eager op still works on every stream given (the streams were left usable)
local function streams_usable(...)
  for _, s in ipairs { tp.current_stream(), ... } do
    assert.are.same({ 2, 2, 2, 2 }, tp.with_stream(s, function() return vals(tp.ones { 4 } * 2) end))
  end
end

describe("tp.graph", function()
  it("replays ops with the results of running them eagerly, and runs nothing at the capture", function()
    for _, dtype in ipairs { "f32", "f64", "f16", "bf16" } do
      local x = tp.arange(6, dtype):add_(1)
      local want = tp.zeros({ 6 }, dtype)
      local step = function(y) y:copy_(x); y:add_(x, 2); y:mul_(x); return y end
      step(want)
      local y = tp.zeros({ 6 }, dtype)
      local g = tp.graph(function() return step(y) end)
      assert.are.same({ 0, 0, 0, 0, 0, 0 }, vals(y))      -- nothing ran yet
      assert.are.equal(y, g:replay())                      -- the function's results, every replay
      assert.tensor_close(want, y, 0, 0)
      x:fill_(2)                                           -- replays read the tensors' memory anew
      g()
      assert.are.same({ 12, 12, 12, 12, 12, 12 }, vals(y))
      g:free()
    end
  end)

  it("replays matmuls, reductions and softmax as they run eagerly", function()
    local x, w = tp.randn({ 4, 8 }, { seed = 3 }), tp.randn({ 8, 8 }, { seed = 4 })
    local step = function() return tp.addmm(x, x, w):softmax(2):sum(1) end
    local want = step()
    local g = tp.graph(step)
    assert.tensor_close(want, g(), 1e-6, 1e-6)
    g:free()
  end)

  it("replays a fork and a join across streams", function()
    local side = tp.stream { name = "graph_side" }
    local x = tp.arange(8)
    local a, b = tp.zeros { 8 }, tp.zeros { 8 }
    local g = tp.graph(function()
      local cur = tp.current_stream()
      side:wait_stream(cur)                               -- side joins the capture
      tp.with_stream(side, function() a:copy_(x); a:mul_(3) end)
      b:copy_(x); b:add_(1)
      cur:wait_stream(side)                               -- and is joined back
      b:add_(a)
    end)
    assert.are.equal(2, g:stats().streams)
    for _ = 1, 3 do g() end
    local want = {}
    for i = 0, 7 do want[i + 1] = 4 * i + 1 end
    assert.are.same(want, vals(b))
    g:free()
  end)

  it("replays collectives: all_reduce in place, async with w:wait(), and in a batch", function()
    local g = tp.world
    local x, y, z = tp.zeros { 4 }, tp.zeros { 4 }, tp.zeros { 4 }
    g:all_reduce(tp.zeros { 4 })                          -- NCCL connects on first use: before the capture
    local gr = tp.graph(function()
      x:fill_(r + 1)
      g:all_reduce(x)
      y:fill_(1)
      local w = g:all_reduce(y, { async = true })
      w:wait()
      z:fill_(2)
      g:batch(function() g:all_reduce(z, { op = "max" }) end)
    end)
    local seq = g:seq()
    for _ = 1, 3 do gr() end
    local total = n * (n + 1) / 2
    assert.are.same({ total, total, total, total }, vals(x))
    assert.are.same({ n, n, n, n }, vals(y))
    assert.are.same({ 2, 2, 2, 2 }, vals(z))
    assert.are.equal(seq + 9, g:seq())                    -- each replay issues the collectives again
    assert.are.equal(3, gr:stats().collectives)
    gr:free()
  end)

  it("keeps the tensors made inside alive with the graph, at the same memory every replay", function()
    local x = tp.arange(16)
    local g = tp.graph(function() local tmp = x * 2; return tmp + 1 end)
    local out = g()
    local ptr = tostring(out:data_ptr())
    assert.are.same(vals(x * 2 + 1), vals(out))
    collectgarbage(); collectgarbage()                    -- tmp is dead in Lua, its memory the graph's
    local before = tp.memory_stats()
    for _ = 1, 5 do assert.are.equal(out, g()) end
    assert.are.equal(ptr, tostring(out:data_ptr()))
    assert.are.equal(before.allocations, tp.memory_stats().allocations)   -- a replay allocates nothing
    x:fill_(1)
    g()
    assert.are.same({ 3, 3, 3, 3 }, vals(out:narrow(1, 1, 4)))
    assert.is_true(g:stats().pool_bytes > 0)
    collectgarbage(); collectgarbage()
    tp.synchronize()
    local held = tp.memory_stats().allocated
    g:free()                                               -- out outlives the graph: its memory too
    collectgarbage(); collectgarbage()
    tp.synchronize()
    assert.are.equal(held, tp.memory_stats().allocated)
    assert.are.same({ 3, 3, 3, 3 }, vals(out:narrow(1, 1, 4)))
  end)

  it("reuses a block freed during the capture on the same stream", function()
    local x = tp.ones { 256 }
    local g = tp.graph(function()
      local acc = x * 1
      for _ = 1, 8 do
        acc = acc + x
        collectgarbage()                                  -- the step's input dies: its block is reused
      end
      return acc
    end)
    local out = g()
    assert.are.same(9, out:narrow(1, 1, 1):item())
    -- 9 tensors of 1 KiB were made; a few blocks serve them all
    assert.is_true(g:stats().pool_bytes <= 4 * 1024, tostring(g:stats().pool_bytes))
    g:free()
  end)

  it("holds the tensors it uses: dropped by the script, freed with the graph", function()
    collectgarbage(); collectgarbage()
    tp.synchronize()
    local base = tp.memory_stats().allocated
    local g
    do
      local x, y = tp.ones { 64 }, tp.zeros { 64 }
      g = tp.graph(function() y:add_(x) end)
      assert.has_error(function() x:free() end)             -- a replay reads it
    end
    collectgarbage(); collectgarbage()
    for _ = 1, 2 do g() end
    assert.is_true(tp.memory_stats().allocated > base)
    g:free()
    assert.has_error(function() g:replay() end, "graph:replay: the graph was freed (g:free())")
    collectgarbage(); collectgarbage()
    tp.synchronize()
    assert.are.equal(base, tp.memory_stats().allocated)
  end)

  it("replays many times", function()
    local x = tp.zeros { 4 }
    local g = tp.graph(function() x:add_(1) end)
    for _ = 1, 200 do g() end
    assert.are.same({ 200, 200, 200, 200 }, vals(x))
    assert.are.equal(200, g:stats().replays)
    g:free()
  end)

  it("replays on another stream after its previous replay", function()
    local side = tp.stream { name = "graph_replay_side" }
    local x = tp.zeros { 4 }
    local g = tp.graph(function() tp.spin(1); x:add_(1); x:mul_(2) end)
    g()
    g:replay(side)                                         -- ordered after the first replay
    tp.current_stream():wait_stream(side)
    assert.are.same({ 6, 6, 6, 6 }, vals(x))
    g:free()
  end)

  it("refuses host reads, waits and exchanges inside the function, naming the call, and goes on", function()
    local x = tp.ones { 4 }
    local side = tp.stream { name = "graph_refuse_side" }
    local cases = {
      { function() x:sum():item() end, "tp.graph: tensor:item() reads to the host during capture" },
      { function() x:totable() end, "tp.graph: tensor:totable() reads to the host during capture" },
      { function() tp.synchronize() end, "tp.graph: tp.synchronize() waits on the host during capture" },
      { function() tp.current_stream():synchronize() end, "tp.graph: stream:synchronize() waits on the host" },
      { function() tp.current_stream():query() end, "tp.graph: stream:query() asks the host" },
      { function() tp.barrier() end, "tp.graph: tp.barrier() exchanges with the other ranks on the host" },
      { function() tp.from { 1, 2 } end, "tp.graph: tp.from() uploads from the host during capture" },
      { function() tp.graph(function() end) end, "tp.graph: a capture is already under way: graphs do not nest" },
      { function() tp.with_stream(side, function() x:add_(1) end) end,
        "tp.graph: tensor:add_() enqueues add on stream 'graph_refuse_side', which is not part of the capture" },
      { function() side:wait_stream(tp.current_stream()); tp.with_stream(side, function() x:add_(1) end) end,
        "tp.graph: stream 'graph_refuse_side' has work in the capture that the capture's stream" },
    }
    for _, case in ipairs(cases) do
      has(error_of(function() tp.graph(function() x:add_(1); case[1]() end) end), case[2])
      assert.are.same({ 1, 1, 1, 1 }, vals(x))             -- nothing of the failed capture ran
      streams_usable(side)
    end
    -- and a capture after them works
    local g = tp.graph(function() x:add_(1) end)
    g()
    assert.are.same({ 2, 2, 2, 2 }, vals(x))
    g:free()
  end)

  it("refuses a wait for work outside the capture, and events of a graph outside it", function()
    local x = tp.ones { 4 }
    local e = tp.event()
    e:record()
    has(error_of(function() tp.graph(function() e:wait() end) end),
      "tp.graph: event:wait() waits for an event recorded outside the capture")
    local inside = tp.event()
    local g = tp.graph(function() x:add_(1); inside:record() end)
    has(error_of(function() inside:wait() end), "tp.graph: event:wait() waits for an event last recorded during a capture")
    has(error_of(function() inside:synchronize() end), "an event last recorded during a capture")
    inside:record()                                       -- recorded again outside: usable
    inside:synchronize()
    g:free()
  end)

  it("passes a function's error through, leaving nothing captured", function()
    local x = tp.ones { 4 }
    assert.has_error(function() tp.graph(function() x:add_(1); error("boom", 0) end) end, "boom")
    assert.is_false(tp.is_capturing())
    assert.are.same({ 1, 1, 1, 1 }, vals(x))
  end)

  it("is traced at each replay: its ops one by one, or one record a replay for a CUDA graph", function()
    local x = tp.zeros { 4 }
    local g = tp.graph(function() x:add_(1); x:mul_(2) end, { name = "traced_graph" })
    local was = tp.trace.active()
    if not was then tp.trace.start() end
    local from = tp.trace.count()
    g(); g()
    local names = {}
    for _, rec in ipairs(tp.trace.records(from, tp.trace.count())) do names[rec[5]] = (names[rec[5]] or 0) + 1 end
    if not was then tp.trace.stop() end
    if g:stats().native then
      assert.are.equal(2, names.traced_graph)
    else
      assert.are.equal(2, names.add)
      assert.are.equal(2, names.mul)
    end
    assert.are.equal("traced_graph", g.name)
    g:free()
  end)

  it("can be timed by tp.time and tp.compare beside the eager function", function()
    local x = tp.ones { 32 }
    local step = function() for _ = 1, 4 do x:add_(1) end return x end
    local g = tp.graph(step)
    local rows = tp.compare({ { "eager", step }, { "graph", g } }, { iters = 2, warmup = 1, quiet = true })
    assert.are.equal(2, #rows)
    assert.is_true(rows.graph.median >= 0)
    assert.is_true(tp.time(g, { iters = 2, warmup = 0 }).median >= 0)
    g:free()
  end)
end)
