-- GPU memory: the stream-ordered pool under the core's stream-ordered free, large tensors (64-bit
-- indexing), and out-of-memory errors that leave the rank usable. CUDA only: on the CPU backend these
-- are reported as skipped.
if tp.backend ~= "cuda" then
  describe("cuda memory", function() pending("needs --backend cuda") end)
  return
end

describe("cuda memory", function()
  it("does not reuse a block freed on the host while another stream still reads it", function()
    local n = 2 ^ 22
    local x = tp.ones({ n })
    local side = tp.stream { name = "side" }
    side:wait_stream(tp.current_stream())
    -- side reads x only after 100 ms; the host frees x at once and allocates on the default stream
    local y = tp.with_stream(side, function() tp.spin(100); return x * 2 end)
    x:free()
    local reused = {}
    for i = 1, 8 do reused[i] = tp.full({ n }, 7) end          -- would take x's block if it were free
    side:synchronize()
    assert.are.equal(2 * n, tp.with_stream(side, function() return y:sum():item() end))
    for i = 1, 8 do assert.are.equal(7 * n, reused[i]:sum():item()) end
    if tp.check.enabled() then                   -- tpsh test --check: the sanitizer names the reliance
      local rs = tp.check.reports()
      assert.are.equal(1, #rs)
      assert.matches("free while in use", rs[1].message, 1, true)
      tp.check.clear()
    end
  end)

  it("honours record_stream for tensors allocated on one stream and used on another", function()
    local side = tp.stream { name = "side" }
    local n = 2 ^ 20
    local out = tp.with_stream(side, function() return tp.zeros({ n }) end)
    local x = tp.full({ n }, 3)
    side:wait_stream(tp.current_stream())
    tp.with_stream(side, function() tp.spin(100); out:copy_(x) end)
    x:record_stream(side)
    x = nil
    collectgarbage(); collectgarbage()
    for _ = 1, 8 do tp.full({ n }, -1) end
    side:synchronize()
    assert.are.equal(3 * n, tp.with_stream(side, function() return out:sum():item() end))
  end)

  it("gives all_gather's list form a temporary that no other stream's queued work still uses", function()
    -- The list form gathers into a temporary and copies out of it. The temporary came from the default
    -- stream even where the collective ran on another, which never waited for the default one: the
    -- pool handed it the block that `old` had just been freed from, which `r`'s kernel, queued behind a
    -- spin on the default stream, had yet to read, and the gather wrote 5s into it meanwhile.
    local g = tp.world
    local n = 2 ^ 22
    collectgarbage(); collectgarbage()
    tp.synchronize()
    local old = tp.full({ g.size, n }, 1)           -- the temporary's size
    tp.spin(300)
    local r = old * 2                               -- reads old after the spin
    old:free()                                      -- stream-ordered, after r's kernel
    local side = tp.stream { name = "side" }
    tp.with_stream(side, function()
      local x = tp.full({ n }, 5)
      local outs = {}
      for i = 1, g.size do outs[i] = tp.empty { n } end
      g:all_gather(outs, x)                         -- on side, which does not wait for the default stream
      assert.are.equal(5 * n, outs[g.size]:sum():item())
    end)
    assert.are.equal(2 * g.size * n, r:sum():item())
  end)

  it("uploads and reads without waiting for another stream's queued work", function()
    -- The two pinned staging buffers serve every stream. After two tp.from calls queued behind a spin,
    -- the third waited for the spin to end before it could reuse a buffer, and so did a read on an idle
    -- stream: the host blocked where the CPU backend's does not (a read waits for its own stream only).
    tp.synchronize()
    tp.spin(400)
    local t0 = tp.now()
    local xs = {}
    for i = 1, 4 do xs[i] = tp.from({ i, i + 1, i + 2 }) end
    local uploads = tp.now() - t0
    local side = tp.stream { name = "side" }
    local t1 = tp.now()
    local v = tp.with_stream(side, function() return tp.full({ 5 }, 2):sum():item() end)
    local read = tp.now() - t1
    assert.are.equal(10, v)
    assert.is_true(uploads < 200, ("four tp.from took %.0f ms of host time behind a 400 ms spin"):format(uploads))
    assert.is_true(read < 200, ("a read on an idle stream took %.0f ms behind a 400 ms spin"):format(read))
    for i = 1, 4 do assert.are.same({ i, i + 1, i + 2 }, xs[i]:totable()) end
  end)

  it("moves tensors of several staging buffers each, in both directions, with buffers in flight", function()
    -- 5.5M f32 = 22 MB: two 16 MiB staging chunks each way. Uploads queued behind a spin keep buffers
    -- in flight while others are taken, added and, in a read, held until copied out.
    local n = 5.5e6
    local big = {}
    for i = 1, n do big[i] = i % 1021 end
    tp.synchronize()
    tp.spin(200)
    local ups = {}
    for k = 1, 3 do ups[k] = tp.from(big) end
    local side = tp.stream { name = "side" }
    local back = tp.with_stream(side, function() return tp.arange(n):totable() end)
    assert.are.equal(n, #back)
    assert.are.equal(0, back[1]); assert.are.equal(n - 1, back[n]); assert.are.equal(4194304, back[4194305])
    for k = 1, 3 do
      local got = ups[k]:totable()
      assert.are.equal(n, #got)
      for i = 1, n, 4099 do assert.are.equal(big[i], got[i]) end
      assert.are.equal(big[n], got[n])
    end
  end)

  it("handles a 2 GiB tensor, and more than 2^31 elements", function()
    local big = tp.ones({ 2 ^ 29 })                 -- 2 GiB of f32
    assert.are.equal(2 ^ 29, big:sum():item())
    big:mul_(0.5)
    assert.are.same({ 0.5, 0.5 }, big:narrow(1, 2 ^ 29 - 1, 2):totable())
    big:free()
    local n = 2 ^ 31 + 16                         -- past 32-bit indexing: u8 arange wraps mod 256
    local u = tp.arange(n, "u8")
    assert.are.same({ 0, 1, 2, 3 }, u:narrow(1, 2 ^ 31 + 1, 4):totable())
    assert.are.same({ 255 }, u:narrow(1, 2 ^ 31, 1):totable())
    local v = u:view({ 2, n / 2 }):transpose(1, 2)  -- strided, offsets past 2^31
    assert.are.same({ (2 ^ 30 + 7) % 256, (2 ^ 31 + 15) % 256 }, v:select(1, n / 2):totable())
    u:free()
  end)

  it("raises a clear error when the device is out of memory, then goes on", function()
    local ok, err = pcall(tp.empty, { 2 ^ 40 }, "u8")   -- 1 TiB
    assert.is_false(ok)
    err = tostring(err)
    assert.is_truthy(err:find("out of device memory", 1, true), err)
    assert.is_truthy(err:find("1099511627776 bytes", 1, true), err)
    assert.is_truthy(err:find("reserved", 1, true), err)
    print("    OOM message: " .. err)
    local t = tp.ones({ 2 ^ 28 })                   -- 1 GiB still works
    assert.are.equal(2 ^ 28, t:sum():item())
  end)

  it("reports the device in use", function()
    assert.is_true(tp.device >= 0)
    assert.are.equal("cuda:" .. tp.device, tp.ones({ 1 }).device_name)
  end)
end)
