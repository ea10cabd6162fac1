-- Named ranges (tp.range, tp.range_push, tp.range_pop; src/core/range.c): records of the trace on a
-- track of their own per rank, nested, in the Chrome trace JSON and the SVG; mismatched pops and ranges
-- left open said clearly; ranges inside tp.time and tp.compare. (NVTX: scripts/gpu/gpu_check.sh's step
-- "ranges", under nsys on the GPU machine.)
local EXE = os.getenv("TPSH_EXE")
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local child = dofile(here .. "support/child_job.lua")
local tf = dofile(here .. "support/trace_file.lua")
local decode_json, read_all, traced_file, on_rank0 = tf.decode_json, tf.read_all, tf.traced_file, tf.on_rank0

-- fn() traced: this rank's range records { name, t0, t1, depth, note }, in the order they closed
local function traced_ranges(fn)
  tp.trace.clear()
  tp.trace.start()
  fn()
  tp.trace.stop()
  local out = {}
  for _, r in ipairs(tp.trace.records()) do
    if r[3] == "range" then out[#out + 1] = { name = r[5], t0 = r[1], t1 = r[2], depth = r[8], note = r[6] } end
  end
  return out
end

local function by_name(list)
  local m = {}
  for _, r in ipairs(list) do m[r.name] = r end
  return m
end

describe("tp.range", function()
  after_each(function()
    tp.trace.stop()
    tp.trace.clear()
  end)

  it("records nested ranges with their depth, the inner ones inside the outer", function()
    local rs = by_name(traced_ranges(function()
      tp.range("step", function()
        tp.range("forward", function() local y = tp.ones { 64 } * 2 end)
        tp.range_push("backward")
        tp.range_push("layer 3")
        local z = tp.ones { 64 } + 1
        tp.range_pop("layer 3")
        tp.range_pop()
      end)
    end))
    for name, depth in pairs { step = 0, forward = 1, backward = 1, ["layer 3"] = 2 } do
      assert.truthy(rs[name], "no record of " .. name)
      assert.are.equal(depth, rs[name].depth, name)
    end
    local function inside(inner, outer)
      assert.is_true(rs[inner].t0 >= rs[outer].t0 and rs[inner].t1 <= rs[outer].t1, inner .. " is not inside " .. outer)
    end
    inside("forward", "step")
    inside("backward", "step")
    inside("layer 3", "backward")
    assert.is_true(rs.forward.t1 <= rs.backward.t0, "forward and backward overlap")
    assert.are.equal(0, tp._range_depth())
  end)

  it("returns what its function returns, and closes its range when the function raises", function()
    local a, b, c = tp.range("r", function(x, y) return x + y, nil, "z" end, 1, 2)
    assert.are.same({ 3, nil, "z" }, { a, b, c })
    local ok, err = pcall(tp.range, "failing", function()
      tp.range_push("inner")
      error("raised inside")
    end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("raised inside", 1, true), tostring(err))
    assert.are.equal(0, tp._range_depth())
  end)

  it("says which range a mismatched pop meets, and that a pop had no push", function()
    local ok, err = pcall(tp.range_pop)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("range_spec.lua:%d+: tp.range_pop: no range is open %(a pop without its push%)"),
      tostring(err))
    tp.range_push("outer")
    local line = debug.getinfo(1, "l").currentline + 1
    tp.range_push("inner")
    ok, err = pcall(tp.range_pop, "outer")
    assert.is_false(ok)
    assert.truthy(tostring(err):find(("tp.range_pop: the innermost open range is 'inner' (pushed at %s:%d), not "
      .. "'outer': ranges close innermost first"):format(debug.getinfo(1, "S").source:sub(2), line), 1, true), tostring(err))
    assert.are.equal(2, tp._range_depth())           -- nothing was popped
    tp.range_pop("inner")
    tp.range_pop("outer")
  end)

  it("refuses a function that leaves a range open or closes tp.range's own", function()
    local ok, err = pcall(tp.range, "outer", function() tp.range_push("leak") end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("tp.range: the function left the range 'leak' (pushed at ", 1, true), tostring(err))
    assert.truthy(tostring(err):find("open (a tp.range_push without its tp.range_pop) inside 'outer'", 1, true), tostring(err))
    assert.are.equal(0, tp._range_depth())
    ok, err = pcall(tp.range, "outer", function() tp.range_pop() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("tp.range: the function closed the range 'outer' that tp.range opened", 1, true),
      tostring(err))
    assert.are.equal(0, tp._range_depth())
  end)

  it("refuses names that are no names, naming the call", function()
    for _, f in ipairs { "range", "range_push", "range_pop" } do
      for _, bad in ipairs { 3, {}, "", "a\0b" } do
        local ok, err = pcall(tp[f], bad, function() end)
        assert.is_false(ok, f)
        assert.truthy(tostring(err):find("tp." .. f .. ": ", 1, true), tostring(err))
      end
    end
    assert.has_error(function() tp.range("x", 3) end, "tp.range: expected a function as argument 2, got number")
    assert.are.equal(0, tp._range_depth())
  end)

  it("works inside tp.time and tp.compare: a range per call of the function", function()
    local x = tp.ones { 256 }
    local rs = traced_ranges(function()
      tp.time(function() tp.range("timed", function() x:add_(1) end) end, { iters = 4, warmup = 1 })
      tp.compare({ { "a", function() return tp.range("variant a", function() return x * 2 end) end },
        { "b", function() tp.range_push("variant b"); local y = x + x; tp.range_pop(); return y end } },
        { iters = 3, warmup = 1, quiet = true, check = true })
    end)
    local n = {}
    for _, r in ipairs(rs) do n[r.name] = (n[r.name] or 0) + 1 end
    assert.are.same({ timed = 5, ["variant a"] = 4, ["variant b"] = 4 }, n)
  end)

  it("has a track of its own per rank in the Chrome trace JSON, nested by depth", function()
    local text = traced_file(".json", function()
      tp.range("outer", function()
        tp.range("inner", function() tp.spin(1) end)
      end)
      local x = tp.ones { 8 }
      tp.world:all_reduce(x)
    end)
    on_rank0(function()
      local doc = decode_json(text)
      local tracks, seen = {}, {}
      for _, e in ipairs(doc.traceEvents) do
        if e.ph == "M" and e.name == "thread_name" then tracks[e.pid .. ":" .. e.tid] = e.args.name end
        if e.ph == "X" and e.cat == "range" then
          assert.are.equal("ranges", tracks[e.pid .. ":" .. e.tid], e.name .. " is not on the ranges track")
          seen[e.pid .. e.name] = e
        elseif e.ph == "X" then
          assert.are_not.equal("ranges", tracks[e.pid .. ":" .. e.tid], e.name .. " is on the ranges track")
        end
      end
      for r = 1, tp.size do
        local o, i = seen[r .. "outer"], seen[r .. "inner"]
        assert.truthy(o and i, "rank " .. (r - 1) .. " lacks a range")
        assert.are.equal(0, o.args.depth)
        assert.are.equal(1, i.args.depth)
        assert.is_true(i.ts >= o.ts and i.ts + i.dur <= o.ts + o.dur + 0.002, "inner is not inside outer")
      end
    end)
  end)

  it("has lanes of its own in the SVG timeline, one per depth", function()
    local text = traced_file(".svg", function()
      tp.range("phase one", function() tp.range("nested", function() local y = tp.ones { 8 } * 3 end) end)
    end)
    on_rank0(function()
      assert.truthy(text:find(">rank 0  ranges<", 1, true), "no ranges lane")
      assert.truthy(text:find(">rank 0  ranges, level 2<", 1, true), "no lane for the nested level")
      assert.truthy(text:find("<title>phase one (range)", 1, true), "no box for 'phase one'")
      assert.truthy(text:find("<title>nested (range)", 1, true), "no box for 'nested'")
    end)
  end)
end)

describe("ranges at the end of a run", function()
  local function tpsh(args)
    return child.run("OPENBLAS_NUM_THREADS=1 " .. child.quote(EXE) .. " --backend cpu " .. args .. " 2>&1", 60)
  end

  it("a range left open is said at the end of the script and ends there in the trace", function()
    if not EXE then return pending("needs TPSH_EXE") end
    local path = tp.rank == 0 and os.tmpname() .. ".json" or ""
    local r = tpsh("--trace " .. child.quote(path) .. " -e " .. child.quote("tp.range_push('never closed'); tp.spin(1)"))
    if tp.rank ~= 0 then return end
    local ok, text = pcall(read_all, path)
    os.remove(path)
    assert.are.equal(0, r.status, r.output)
    assert.truthy(r.output:find("tpsh: warning: 1 range was left open at the end of the script (a tp.range_push "
      .. "without its tp.range_pop), closed there: 'never closed' (pushed at (command line):1)", 1, true), r.output)
    assert.is_true(ok, tostring(text))
    assert.truthy(text:find('"name":"never closed","cat":"range"', 1, true), text)
    assert.truthy(text:find('"note":"left open at the end of the script"', 1, true), text)
  end)

  it("`tpsh test` fails a test that leaves a range open, and closes it", function()
    if not EXE then return pending("needs TPSH_EXE") end
    local r = tpsh("test -o plain " .. child.quote(here .. "runner/range_fixture.lua"))
    assert.are.equal(1, r.status, r.output)
    assert.truthy(r.output:find("range fixture leaves a range open [0] at ", 1, true), r.output)
    assert.truthy(r.output:find("the test left 'forgotten' (pushed at ", 1, true), r.output)
    assert.truthy(r.output:find("2 passed, 1 failed, 0 skipped", 1, true), r.output)
  end)

  it("a failed run's own trace holds the range it ended in, not finished, and one an error closed", function()
    if not EXE then return pending("needs TPSH_EXE") end
    local path = tp.rank == 0 and os.tmpname() .. ".json" or ""
    local r = tpsh("--trace " .. child.quote(path) .. " -e " ..
      child.quote("tp.range_push('backward'); tp.range('layer 3', function() error('failed on purpose') end)"))
    if tp.rank ~= 0 then return end
    local ok, text = pcall(read_all, path)
    os.remove(path)
    assert.are.equal(1, r.status, r.output)
    assert.is_true(ok, tostring(text))
    assert.truthy(text:find('"name":"layer 3","cat":"range"', 1, true), text)
    assert.truthy(text:find('"note":"closed by an error raised inside it"', 1, true), text)
    assert.truthy(text:find('"name":"backward (not finished)","cat":"range"', 1, true), text)
  end)
end)
