-- tp.graph on the GPU: what a CUDA graph adds to tests/graph_spec.lua's cases (which run here too): a
-- replay is one graph launch, cuBLAS and the kernels' scratch inside a capture, the graph pool's memory
-- kept from other users, NCCL calls captured (collectives, a send/receive ring, an async collective on
-- the comm stream), a failed capture that leaves the streams and the communicator usable. CUDA only (on
-- the CPU this is reported as skipped).
if tp.backend ~= "cuda" then
  describe("cuda graph", function() pending("needs --backend cuda") end)
  return
end

local n, r = tp.size, tp.rank
local function vals(t) return t:totable() end

describe("cuda graph", function()
  it("replays as one CUDA graph launch (the recorded ops one by one in check mode)", function()
    local x = tp.zeros { 1024 }
    local g = tp.graph(function() for _ = 1, 10 do x:add_(1) end end)
    g()
    assert.are.equal(not tp.check.enabled(), g:stats().native)
    assert.are.equal(10, g:stats().kernels)
    assert.are.equal(10, x:narrow(1, 1, 1):item())
    g:free()
  end)

  it("captures a stream's first matmul (cuBLAS's workspace) and a sum (the kernel's scratch)", function()
    local s = tp.stream { name = "graph_blas" }             -- no matmul has run on it yet
    s:wait_stream(tp.current_stream())
    local a, b = tp.randn({ 64, 32 }, { seed = 1 }), tp.randn({ 32, 48 }, { seed = 2 })
    local want = tp.matmul(a, b)
    local want_sum = want:sum():item()
    local c, total
    local g = tp.with_stream(s, function()
      return tp.graph(function()
        c = tp.matmul(a, b)
        total = c:sum()
        return c, total
      end)
    end)
    for _ = 1, 3 do tp.with_stream(s, function() g() end) end
    tp.current_stream():wait_stream(s)
    assert.tensor_close(want, c, 1e-5, 1e-5)
    assert.is_true(math.abs(total:item() - want_sum) <= 1e-3 * math.max(1, math.abs(want_sum)))
    g:free()
  end)

  it("keeps the memory of tensors that died in the capture from every other allocation", function()
    local x = tp.ones { 4096 }
    local dead_ptr
    local g = tp.graph(function()
      local tmp = x * 3
      dead_ptr = tostring(tmp:data_ptr())
      local out = tmp + 1
      tmp = nil
      collectgarbage(); collectgarbage()                  -- tmp's block goes back to the graph's pool
      return out
    end)
    local keep = {}
    for k = 1, 16 do
      keep[k] = tp.empty { 4096 }
      assert.are_not.equal(dead_ptr, tostring(keep[k]:data_ptr()))
    end
    local out = g()
    assert.are.same({ 4, 4 }, vals(out:narrow(1, 1, 2)))
    g:free()
  end)

  it("captures collectives on NCCL: in place, async on the comm stream, and a send/receive ring", function()
    local w = tp.world
    local x, y = tp.zeros { 8 }, tp.zeros { 8 }
    local send, recv = tp.full({ 8 }, r), tp.zeros { 8 }
    local right, left = (r + 1) % n, (r - 1 + n) % n
    local function step()
      x:fill_(r + 1)
      w:all_reduce(x)
      y:fill_(2)
      w:all_reduce(y, { async = true, op = "max" }):wait()
      if n > 1 then w:batch(function() w:send(send, right); w:recv(recv, left) end) end
    end
    step()                                                 -- NCCL connects on first use: outside the capture
    tp.synchronize()
    x:fill_(0); y:fill_(0); recv:fill_(0)
    local g = tp.graph(step)
    for _ = 1, 3 do g() end
    local total = n * (n + 1) / 2
    assert.are.same(vals(tp.full({ 8 }, total)), vals(x))
    assert.are.same(vals(tp.full({ 8 }, 2)), vals(y))
    if n > 1 then assert.are.same(vals(tp.full({ 8 }, left)), vals(recv)) end
    g:free()
  end)

  it("leaves the streams and the communicator usable after a capture that failed", function()
    local x = tp.ones { 8 }
    local side = tp.stream { name = "graph_failed_side" }
    assert.has_error(function()
      tp.graph(function()
        side:wait_stream(tp.current_stream())
        tp.with_stream(side, function() tp.world:all_reduce(x) end)
        error("stop", 0)                                   -- side is left in the capture, unjoined
      end)
    end, "stop")
    tp.world:all_reduce(x)
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() x:add_(1) end)
    tp.current_stream():wait_stream(side)
    assert.are.same(vals(tp.full({ 8 }, n + 1)), vals(x))
  end)
end)
