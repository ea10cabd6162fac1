-- tp.trace: records, the Chrome trace JSON, the summary's overlap, the SVG timeline, on every rank count.
local ffi = require "ffi"
pcall(ffi.cdef, "int usleep(unsigned int usec);")
local C = ffi.C

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local tf = dofile(here .. "support/trace_file.lua")
local decode_json, read_all, shared_tmp, traced_file, on_rank0 = tf.decode_json, tf.read_all, tf.shared_tmp,
  tf.traced_file, tf.on_rank0

-- A short schedule on two named streams: compute on "default", an async all_gather on the group's comm
-- stream, a gather on a side stream, stream waits and host blocks. Correctly ordered: `tpsh test
-- --check` finds nothing in it.
local function schedule(side)
  local x = tp.rand({ 4096 })
  local out = tp.empty({ tp.size * 4096 })
  tp.spin(2)
  local w = tp.world:all_gather(out, x, { async = true })
  tp.matmul(tp.ones({ 32, 16 }), tp.ones({ 16, 8 }))
  w:wait()
  side:wait_stream(tp.current_stream())
  tp.with_stream(side, function() tp.world:all_gather(out, x) end)
  tp.current_stream():wait_stream(side)
  local v = out:sum():item()
  w:block()
  return v
end

describe("tp.trace", function()
  after_each(function()
    tp.trace.stop()
    tp.trace.clear()
  end)

  it("records nothing while off", function()
    tp.trace.clear()
    local n = tp.trace.count()
    tp.spin(1)
    tp.synchronize()
    assert.are.equal(n, tp.trace.count())
    assert.is_false(tp.trace.active())
  end)

  it("does not charge an op with stream work the trace does not record (a free, an upload) before it", function()
    -- the next op took the previous op's end marker as its start while the stream was busy, so a free
    -- of 200 MB between a 200 ms spin and a 1 ms one made the 1 ms spin last as long as the free too
    -- (audit, 2026-12-01)
    local up = {}
    for i = 1, 200000 do up[i] = i end
    -- Up to three tries: a spin ends by the wall clock, so a worker descheduled in it on a loaded machine
    -- (3 ranks and builds on 2 cores) really takes longer (11.6 ms once); the bug added the free and the
    -- upload to every try.
    local spins, uploaded
    for _ = 1, 3 do
      local big = tp.ones({ 50 * 1024 * 1024 })
      tp.synchronize()
      tp.trace.clear()
      tp.trace.start()
      tp.spin(200)
      big:free()
      uploaded = tp.from(up, "f64")
      tp.spin(1)
      tp.synchronize()
      tp.trace.stop()
      spins = {}
      for _, r in ipairs(tp.trace.records()) do
        if r[5] == "spin" then spins[#spins + 1] = r[2] - r[1] end
      end
      if #spins == 2 and spins[2] < 10 then break end
    end
    assert.are.equal(2, #spins)
    assert.is_true(spins[1] >= 199, "the 200 ms spin took " .. spins[1])
    assert.is_true(spins[2] < 10, "the 1 ms spin was recorded as " .. spins[2] .. " ms")
    assert.are.equal(200000, uploaded:numel())
  end)

  it("times an op that follows an idle gap from its own start, and records what each op was given", function()
    -- an op takes the stream's last end marker as its start only while the stream is still busy: on an
    -- idle stream that marker was reached long ago, and the op would be charged with the gap
    tp.trace.start()
    tp.spin(5)
    tp.synchronize()
    local t = tp.now()
    while tp.now() - t < 100 do end
    tp.spin(1)
    local x = tp.ones { 4 }
    tp.world:all_reduce(x)
    tp.synchronize()
    tp.trace.stop()
    local spins, reduce = {}, nil
    for _, r in ipairs(tp.trace.records()) do
      if r[5] == "spin" then spins[#spins + 1] = r end
      if r[5] == "all_reduce" then reduce = r end
    end
    assert.are.equal(2, #spins)
    assert.is_true(spins[2][2] - spins[2][1] < 50, "the 1 ms spin after 100 ms idle took " .. (spins[2][2] - spins[2][1]))
    assert.are.equal("1 ms", spins[2][6])
    assert.is_truthy(reduce and reduce[6]:find(("^f32 x 4 per rank, group %%d+ of %d$"):format(tp.size)),
      reduce and reduce[6])
  end)

  it("names a send's and a receive's peer and a broadcast's root, with the world rank in a sub-group", function()
    local x, r = tp.ones { 3 }, tp.empty { 3 }
    local last = tp.size - 1
    -- a sub-group whose ranks are the world's in reverse: group rank 0 is world rank size - 1
    local rev = {}
    for i = last, 0, -1 do rev[#rev + 1] = i end
    local sub = tp.new_group(rev)
    tp.trace.start()
    tp.world:broadcast(x, last)
    -- rank 0 sends to the last rank, which receives; then the other way in a batch of two, on the group
    -- that numbers them the other way round
    if tp.size > 1 and tp.rank == 0 then tp.world:send(x, last) end
    if tp.size > 1 and tp.rank == last then tp.world:recv(r, 0) end
    if tp.size > 1 and (tp.rank == 0 or tp.rank == last) then
      local peer = tp.rank == 0 and 0 or last   -- the other end, as a rank of sub
      sub:batch(function() sub:send(x, peer); sub:recv(r, peer) end)
    end
    sub:broadcast(x, 0)
    tp.synchronize()
    tp.trace.stop()
    local args = {}
    for _, rec in ipairs(tp.trace.records()) do args[#args + 1] = rec[5] .. ": " .. rec[6] end
    local text = table.concat(args, "\n")
    local function has(line)
      assert.is_truthy(text:find(line, 1, true), "expected the line '" .. line .. "' among:\n" .. text)
    end
    has(("broadcast: f32 x 3 per rank, root rank %d, group 0 of %d"):format(last, tp.size))
    if tp.size == 1 then
      has(("broadcast: f32 x 3 per rank, root rank 0, group %d of 1"):format(sub.id))
      return
    end
    has(("broadcast: f32 x 3 per rank, root rank 0 (world rank %d), group %d of %d"):format(last, sub.id, tp.size))
    if tp.rank == 0 then
      has(("send: f32 x 3 to rank %d, group 0 of %d"):format(last, tp.size))
      has(("batch: 2 calls: send to rank 0 (world rank %d), recv from rank 0 (world rank %d), group %d of %d")
        :format(last, last, sub.id, tp.size))
    elseif tp.rank == last then
      has(("recv: f32 x 3 from rank 0, group 0 of %d"):format(tp.size))
      has(("batch: 2 calls: send to rank %d (world rank 0), recv from rank %d (world rank 0), group %d of %d")
        :format(last, last, sub.id, tp.size))
    else
      assert.is_falsy(text:find("send", 1, true), text)
    end
  end)

  it("writes Chrome trace JSON with one process per rank and one named track per stream", function()
    local side = tp.stream { name = "side" }
    local text = traced_file(".json", function() schedule(side) end)
    on_rank0(function()
      local doc = decode_json(text)
      assert.is_table(doc.traceEvents)
      local procs, threads, used, cats = {}, {}, {}, {}
      for _, e in ipairs(doc.traceEvents) do
        if e.ph == "M" and e.name == "process_name" then procs[e.pid] = e.args.name end
        if e.ph == "M" and e.name == "thread_name" then threads[e.pid .. ":" .. e.tid] = e.args.name end
        if e.ph == "X" then
          assert.is_true(e.dur >= 0, "negative duration")
          assert.is_true(e.ts >= 0, "negative timestamp")
          used[e.pid .. ":" .. e.tid] = true
          cats[e.cat] = (cats[e.cat] or 0) + 1
          if e.name == "all_gather" then
            assert.are.equal("comm", e.cat)
            assert.is_number(e.args.seq)
            assert.are.equal(tp.size * 4096 * 4, e.args.bytes)
          end
          if e.name == "matmul" then assert.are.equal("f32[32, 8] f32[32, 16] f32[16, 8]", e.args.shapes) end
        end
      end
      -- ids from 1: Perfetto takes pid 0 and tid 0 for the kernel's idle task
      assert.is_nil(procs[0], "a process with pid 0")
      for k in pairs(threads) do assert.is_falsy(k:match(":0$"), "a track with tid 0: " .. k) end
      for r = 0, tp.size - 1 do
        assert.are.equal("rank " .. r, procs[r + 1])
        local names = {}
        for k, name in pairs(threads) do
          if k:match("^(%d+):") == tostring(r + 1) then names[name] = true end
        end
        for _, want in ipairs { "default", "side", "comm0", "host" } do
          assert.is_true(names[want], ("rank %d has no track named %s"):format(r, want))
        end
      end
      for k in pairs(used) do assert.is_string(threads[k], "an event on an unnamed track " .. k) end
      for _, c in ipairs { "compute", "comm", "wait", "host" } do
        assert.is_true((cats[c] or 0) > 0, "no event of category " .. c)
      end
    end)
  end)

  it("aligns the ranks' clocks: no rank ends a collective before another rank started it", function()
    local x, out = tp.rand({ 1024 }), tp.empty({ tp.size * 1024 })
    tp.trace.start()
    for _ = 1, 3 do
      tp.world:all_gather(out, x)
      tp.spin(1)
    end
    tp.synchronize()
    tp.trace.stop()
    local mine = {}
    for _, r in ipairs(tp.trace.records()) do
      if r[5] == "all_gather" then mine[#mine + 1] = { r[1], r[2] } end
    end
    local all = tp.allgather(mine)
    for i = 1, 3 do
      local last_start, first_end = -math.huge, math.huge
      for _, per in ipairs(all) do
        last_start = math.max(last_start, per[i][1])
        first_end = math.min(first_end, per[i][2])
      end
      assert.is_true(last_start <= first_end + 0.5, ("all_gather %d: a rank ended %.3f ms before the last began"):format(
        i, last_start - first_end))
    end
  end)

  it("writes each estimated clock offset and its uncertainty in the JSON, none where the clock is shared", function()
    -- one host: the clocks are the same and nothing is written
    local text = traced_file(".json", function() tp.spin(1) end)
    on_rank0(function() assert.is_nil(decode_json(text).otherData.clock_alignment_by_rank) end)
    -- ranks on other hosts, as the forced ping-pong makes every rank but 0
    local trace = require "tpsh.trace"
    trace._clock_rounds = -8
    finally(function() trace._clock_rounds = 16 end)
    text = traced_file(".json", function() tp.spin(1) end)
    on_rank0(function()
      local by_rank = decode_json(text).otherData.clock_alignment_by_rank
      if tp.size == 1 then return assert.is_nil(by_rank) end
      for r = 1, tp.size - 1 do
        local c = by_rank[tostring(r)]
        assert.is_table(c, "no entry for rank " .. r)
        assert.is_true(c.uncertainty_ms > 0, "uncertainty " .. c.uncertainty_ms)
        -- one clock in truth: the offset taken is within the uncertainty written beside it
        assert.is_true(math.abs(c.offset_ms) <= c.uncertainty_ms + 1e-6,
          ("rank %d: offset %g ms, uncertainty %g ms"):format(r, c.offset_ms, c.uncertainty_ms))
      end
      assert.is_nil(by_rank["0"])
    end)
  end)

  it("measures a clock offset by ping-pong within half its round trip on one machine", function()
    -- One clock, so the true offset is 0 and the estimate is off by at most half the round trip of
    -- the sample kept. A fixed bound (5 ms) is too tight: 4 ranks on 2 cores, every waiting rank
    -- polling MPI, left the shortest of 8 round trips at 5.5-8 ms (design.md, "Clocks across hosts").
    local off, rtt = ffi.new("double[1]"), ffi.new("double[1]")
    assert.are.equal(0, ffi.C.tpsh_trace_clock_offset(tp.world._p, -8, off, rtt))
    if tp.rank == 0 then
      assert.are.equal(0, off[0])
      assert.are.equal(0, rtt[0])
    else
      assert.is_true(rtt[0] > 0 and rtt[0] < 1e300, "round trip " .. rtt[0] .. " ms")
      assert.is_true(math.abs(off[0]) <= rtt[0] / 2, ("offset %g ms, round trip %g ms"):format(off[0], rtt[0]))
    end
    assert.are.equal(0, ffi.C.tpsh_trace_clock_offset(tp.world._p, 8, off, rtt))
    assert.are.equal(0, off[0])                      -- same host: the same clock
    assert.are.equal(0, rtt[0])
  end)

  it("records stream waits on the waiting stream and host blocks on the host track", function()
    local x, out = tp.rand({ 1024 }), tp.empty({ tp.size * 1024 })
    tp.trace.start()
    local w = tp.world:all_gather(out, x, { async = true })
    w:wait()
    w:block()
    out:sum():item()
    tp.trace.stop()
    local names = {}
    for _, r in ipairs(tp.trace.records()) do names[r[5] .. "/" .. r[3] .. "/" .. (r[4] < 0 and "host" or "dev")] = true end
    assert.is_true(names["wait/wait/dev"])
    assert.is_true(names["event_synchronize/host/host"])
    assert.is_true(names["to_host/host/host"])
    assert.is_true(names["all_gather/comm/dev"])
  end)

  it("records a barrier's wait on the host track", function()
    -- it was not recorded: a rank waiting there for a late one showed an idle host (audit, 2026-12-02)
    tp.barrier()
    tp.trace.start()
    if tp.rank == 0 then C.usleep(60000) end
    tp.barrier()
    tp.trace.stop()
    local waits = {}
    for _, r in ipairs(tp.trace.records()) do
      if r[5] == "barrier" then waits[#waits + 1] = r end
    end
    assert.are.equal(1, #waits)
    assert.are.equal("host", waits[1][3])
    assert.are.equal(-1, waits[1][4])
    if tp.rank > 0 then
      assert.is_true(waits[1][2] - waits[1][1] >= 30, "the barrier's record lasted " .. (waits[1][2] - waits[1][1]))
    end
  end)

  it("names the copies of a list-form all_gather as docs/api.md does", function()
    local x, outs = tp.ones({ 4 }), {}
    for i = 1, tp.size do outs[i] = tp.empty({ 4 }) end
    tp.trace.start()
    tp.world:all_gather(outs, x)
    tp.synchronize()
    tp.trace.stop()
    local copies = 0
    for _, r in ipairs(tp.trace.records()) do
      if r[5] == "all_gather (its copy to a list output)" and r[3] == "compute" then copies = copies + 1 end
    end
    assert.are.equal(tp.size, copies)
  end)

  it("reports more overlap for a schedule built to overlap than for its serial twin", function()
    -- Check mode (tpsh --check test) matches each collective across the ranks on the host before it is
    -- enqueued, so the gather would start when the last rank arrives: on 3 ranks on CI's 2 cores one
    -- came more than the 55 ms margin late. The schedule's timing is under test here, not its order.
    local was_checking = tp.check.enabled()
    tp.check.enable(false)
    finally(function() tp.check.enable(was_checking) end)
    local side = tp.stream { name = "side" }
    local x, out = tp.rand({ 65536 }), tp.empty({ tp.size * (65536) })
    tp.synchronize()
    local function run(overlapped)
      tp.barrier()
      local from = tp.trace.count()
      if overlapped then
        -- compute on default, and side communicates once default is computing (the host waits for
        -- that: else a short gather could run before the default worker woke up, or between its ops)
        tp.spin(2)
        local started = tp.event():record()
        tp.spin(58)
        started:synchronize()
        C.usleep(3000)                                   -- ... and is well into its second op
        tp.with_stream(side, function() tp.world:all_gather(out, x) end)
      else
        tp.world:all_gather(out, x)                      -- the same, one after the other
        tp.spin(2)
        tp.spin(58)
      end
      tp.synchronize()
      return tp.trace.stats(tp.trace.records(from, tp.trace.count()))
    end
    tp.trace.start()
    local serial, overlapped = run(false), run(true)
    tp.trace.stop()
    for _, s in ipairs { serial, overlapped } do
      assert.is_true(s.overlap >= 0 and s.overlap <= 1)
      assert.is_true(s.comm > 0 and s.compute >= 50 and s.idle >= 0)
    end
    assert.is_true(serial.overlap < 0.05, "serial overlap " .. serial.overlap)
    assert.is_true(overlapped.overlap > serial.overlap, ("overlap %.3f vs serial %.3f"):format(overlapped.overlap,
      serial.overlap))
  end)

  it("summarises every rank on every rank, with overlap in [0, 1]", function()
    tp.trace.start()
    schedule(tp.stream { name = "side" })
    tp.trace.stop()
    local all = tp.trace.summary { quiet = true }
    assert.are.equal(tp.size, #all)
    for r, s in ipairs(all) do
      assert.are.equal(r - 1, s.rank)
      assert.is_true(s.overlap >= 0 and s.overlap <= 1)
      assert.is_true(s.compute > 0 and s.comm > 0 and s.idle >= 0)
    end
  end)

  it("draws an SVG timeline with a lane per stream per rank, a time axis and a legend", function()
    local text = traced_file(".svg", function() schedule(tp.stream { name = "side" }) end)
    on_rank0(function()
      local s = text
      assert.is_truthy(s:match("^<svg "))
      assert.is_truthy(s:match("</svg>%s*$"))
      for r = 0, tp.size - 1 do
        for _, lane in ipairs { "host", "default", "side", "comm0" } do
          assert.is_truthy(s:find(("rank %d  %s"):format(r, lane), 1, true), "no lane " .. r .. " " .. lane)
        end
      end
      for _, word in ipairs { ">compute<", ">comm<", ">wait<", ">host<", ">ms<" } do
        assert.is_truthy(s:find(word, 1, true), "missing " .. word)
      end
      local _, opens = s:gsub("<rect", "")
      local _, closes = s:gsub("</rect>", "")
      assert.is_true(closes > 0)
      assert.is_true(opens >= closes)
    end)
  end)

  it("gives this rank's statistics when stats has no argument", function()
    tp.trace.start()
    schedule(tp.stream { name = "side" })
    tp.trace.stop()
    local bare, given = tp.trace.stats(), tp.trace.stats(tp.trace.records())
    assert.is_true(bare.compute > 0 and bare.comm > 0)
    for _, k in ipairs { "compute", "comm", "idle", "overlap", "window" } do
      assert.are.equal(given[k], bare[k], k)
    end
  end)

  it("never lets back-to-back ops on one track overlap in the JSON (each box's end is rounded once)", function()
    -- Start and duration were rounded apart: one op in twenty ended 1 ns after the next began, and
    -- Perfetto drops such a box from the timeline.
    local text = traced_file(".json", function()
      local y = tp.ones { 8 }
      for _ = 1, 1500 do y:add_(1) end
      tp.synchronize()
    end)
    on_rank0(function()
      local doc = decode_json(text)
      local tracks = {}
      for _, e in ipairs(doc.traceEvents) do
        if e.ph == "X" and e.cat ~= "span" then
          local k = e.pid .. ":" .. e.tid
          tracks[k] = tracks[k] or {}
          -- in whole ns, as written (three decimals of us)
          table.insert(tracks[k], { math.floor(e.ts * 1000 + 0.5), math.floor(e.dur * 1000 + 0.5) })
        end
      end
      local n = 0
      for k, list in pairs(tracks) do
        table.sort(list, function(a, b) return a[1] < b[1] end)
        for i = 2, #list do
          local a, b = list[i - 1], list[i]
          local a_end, b_end = a[1] + a[2], b[1] + b[2]
          assert.is_false(b[1] < a_end and b_end > a_end,
            ("track %s: a box at %d ns overlaps the one before it, which ends at %d ns"):format(k, b[1], a_end))
          n = n + 1
        end
      end
      assert.is_true(n >= 1500, "too few ops in the trace: " .. n)
    end)
  end)

  it("writes any name as valid UTF-8 in the JSON and the SVG", function()
    local clean = require("tpsh.utf8").clean
    assert.are.equal("plain", clean("plain"))
    assert.are.equal("\195\169t\195\169", clean("\195\169t\195\169"))            -- été stays
    assert.are.equal("a\239\191\189b", clean("a\255b"))                          -- a stray byte
    assert.are.equal("\239\191\189", clean("\195"))                              -- a cut character
    assert.are.equal("\239\191\189\239\191\189", clean("\192\175"))               -- an overlong '/'
    assert.are.equal("\239\191\189\239\191\189\239\191\189", clean("\237\160\128"))   -- a surrogate
    local name = "r\195\169sum\255"
    local all = { { rank = 0, streams = { [0] = { id = 3, name = name } }, dropped = 0, records = {
      { 0, 1, "compute", 0, "op\1\255", "", 8, 0 }, { 0, 2, "span", -1, "tab\tand\1", "", 0, -1 } } } }
    local json = require("tpsh.trace")._chrome_json(all)
    assert.are.equal(json, clean(json), "the JSON is not valid UTF-8")
    assert.is_truthy(json:find('"op\\u0001\239\191\189"', 1, true))
    assert.is_truthy(json:find('"r\195\169sum\239\191\189"', 1, true))
    local svg = require("tpsh.trace_svg").render(all, 0, { width = 800 })
    assert.are.equal(svg, clean(svg), "the SVG is not valid UTF-8")
    assert.is_nil(svg:find("[\1-\8\11\12\14-\31]"), "a control character XML refuses")
  end)

  it("draws round ticks, merges only adjacent tiny boxes, and puts a span over the one that holds it", function()
    local svg = require "tpsh.trace_svg"
    local function rec(t0, t1, name) return { t0, t1, "compute", 0, name, "", 8, 0 } end
    -- 100 ms over 610 px (0.16 ms a pixel): two tiny ops 0.01 ms apart are one box, a tiny one 50 ms
    -- later is a box of its own
    local all = { { rank = 0, streams = { [0] = { id = 3, name = "s" } }, dropped = 0, records = {
      rec(0, 0.01, "a"), rec(0.02, 0.03, "a2"), rec(50, 50.01, "b"), rec(99.99, 100, "c"),
      { 20, 30, "span", -1, "inner", "", 0, -1 }, { 10, 90, "span", -1, "outer", "", 0, -1 } } } }
    local s = svg.render(all, 0, { width = 800 })
    assert.is_truthy(s:find("<title>2 ops (compute)", 1, true), s)
    assert.is_truthy(s:find("<title>b (compute)", 1, true), s)
    -- a step of exactly span / 10 is round already: ticks every 10 ms, 90 among them
    assert.is_truthy(s:find(">90</text>", 1, true), s)
    -- the longer span first, so the nested one is drawn over it
    assert.is_true(s:find("<title>outer (span)", 1, true) < s:find("<title>inner (span)", 1, true))
    -- 1 ms: ticks every 0.1 ms, labelled with their decimal
    all[1].records = { rec(0, 1, "x") }
    s = svg.render(all, 0, { width = 800 })
    assert.is_truthy(s:find(">0.5</text>", 1, true), s)
  end)

  it("says where the trace is read that records were dropped (the record limit)", function()
    local all = { { rank = 0, streams = {}, dropped = 0, records = { { 0, 1, "compute", -1, "op", "", 8, 0 } } },
                  { rank = 1, streams = {}, dropped = 1234, records = {} } }
    local json = require("tpsh.trace")._chrome_json(all)
    assert.is_truthy(json:find('"otherData":{"tool":"tpsh","dropped_records_by_rank":{"1":1234}}', 1, true), json)
    local svg = require("tpsh.trace_svg").render(all, 0)
    assert.is_truthy(svg:find("the trace was full, later records were not kept: rank 1 dropped 1234", 1, true))
    all[2].dropped = 0
    assert.is_nil(require("tpsh.trace")._chrome_json(all):find("dropped", 1, true))
  end)

  -- trace.lua's _save_own (a failed run's end, from the host; runner_spec runs it): where a rank's own
  -- records go, beside --trace's file, and what the file says of the run's end
  it("names a failed run's per-rank trace beside the file, before its extension", function()
    local own = require("tpsh.trace")._own_path
    assert.are.equal("/tmp/t.json", own("/tmp/t.json", 1, 1))            -- one rank: the file itself
    assert.are.equal("/tmp/t.rank1.json", own("/tmp/t.json", 1, 2))
    assert.are.equal("run.v2.rank12.svg", own("run.v2.svg", 12, 16))
    assert.are.equal("a.b/trace.rank0", own("a.b/trace", 0, 2))           -- no extension: not the directory's
    assert.are.equal("/tmp/.json.rank3", own("/tmp/.json", 3, 4))
    local all = { { rank = 2, streams = {}, dropped = 0, records = {}, ended = { status = 4, unfinished = 1, not_started = 7 } } }
    local json = require("tpsh.trace")._chrome_json(all)
    assert.is_truthy(json:find('"run_ended_by_failure":{"2":{"status":4,"ops_not_finished":1,"ops_not_started":7}}', 1, true), json)
    all[1].ended.message = 'x.lua:3: "bad"\nstack traceback:'
    json = require("tpsh.trace")._chrome_json(all)
    assert.is_truthy(json:find('"ops_not_started":7,"message":"x.lua:3: \\"bad\\"\\nstack traceback:"}}', 1, true), json)
  end)

  -- trace.lua: the uncertainty written is half the round trip (collect's clock = { offset, rtt }), and
  -- times are rounded to the nearest nanosecond, not truncated (either could change unseen: the tests of
  -- real traces only bound them)
  it("writes a clock's uncertainty as half its round trip and times rounded to the nearest ns", function()
    local all = { { rank = 0, streams = {}, dropped = 0, records = { { 0, 0.0000027, "compute", -1, "op", "", 8, 0 },
                    { 0.0000038, 0.001, "compute", -1, "op", "", 8, 1 } } },
                  { rank = 1, streams = {}, dropped = 0, records = {}, clock = { 0.25, 0.3 } } }
    local json = require("tpsh.trace")._chrome_json(all)
    assert.is_truthy(json:find('"clock_alignment_by_rank":{"1":{"offset_ms":0.250000,"uncertainty_ms":0.150000}}',
      1, true), json)
    assert.is_truthy(json:find('"ts":0.000,"dur":0.003,', 1, true), json)          -- 2.7 ns: 3
    assert.is_truthy(json:find('"ts":0.004,"dur":0.996,', 1, true), json)          -- 3.8 ns: 4
  end)

  it("reads records up to the count, whatever end it is given", function()
    tp.trace.clear()
    tp.trace.start()
    tp.ones({ 4 }):add_(1)
    tp.synchronize()
    tp.trace.stop()
    local n = tp.trace.count()
    assert.is_true(n > 0)
    assert.are.equal(#tp.trace.records(), #tp.trace.records(0, n + 1000))
    assert.are.equal(#tp.trace.records(1), #tp.trace.records(1, n + 1))
  end)

  it("raises on rank 0 when the file cannot be written whole (a full disk), for the JSON and the SVG", function()
    -- f:write's and f:close's errors were not looked at: a full disk left a cut-short file and
    -- --trace ended with status 0 (audit, 2026-12-02)
    local probe = io.open("/dev/full", "w")
    if not probe then return pending("needs /dev/full") end
    probe:close()
    tp.trace.start()
    tp.spin(1)
    tp.trace.stop()
    local results = {}                                -- both calls on every rank before any assert
    for _, save in ipairs { tp.trace.save, tp.trace.svg } do results[#results + 1] = { pcall(save, "/dev/full") } end
    for _, r in ipairs(results) do
      if tp.rank == 0 then
        assert.is_false(r[1], "no error for a full disk")
        assert.is_truthy(tostring(r[2]):find("cannot write the file: /dev/full: No space left on device", 1, true),
          tostring(r[2]))
      else
        assert.is_true(r[1], tostring(r[2]))         -- rank 0 writes, the others only send their records
      end
    end
  end)

  it("writes beside the file and renames it: a link at the name is replaced, its target never written", function()
    -- (issue 45) the file was opened in place: a link planted at a trace's path had its target rewritten
    local dir = tp.bcast(tp.rank == 0 and os.tmpname() or nil)
    if tp.rank == 0 then os.remove(dir); assert(os.execute("mkdir " .. dir) == 0) end
    local victim, link = dir .. "/victim", dir .. "/trace.json"
    if tp.rank == 0 then
      local f = assert(io.open(victim, "w")); f:write("keep"); f:close()
      assert(os.execute(("ln -s %s %s"):format(victim, link)) == 0)
    end
    tp.barrier()
    tp.trace.start()
    tp.spin(1)
    tp.trace.stop()
    tp.trace.save(link)
    tp.barrier()
    on_rank0(function()
      assert.are.equal("keep", read_all(victim))
      assert.is_truthy(read_all(link):find('"traceEvents"', 1, true))
      local p = io.popen("ls -A " .. dir)                       -- no link left, no temporary either
      local names = p:read("*a")
      p:close()
      assert.are.equal("trace.json\nvictim\n", names)
      assert.are.equal(0, os.execute("test ! -L " .. link))
    end)
    if tp.rank == 0 then os.execute("rm -rf " .. dir) end
  end)

  it("names the call in its errors", function()
    assert.has_error(function() tp.trace.save(42) end, "tp.trace.save: expected a file name, got number")
    assert.has_error(function() tp.trace.save("") end, "tp.trace.save: expected a file name, got an empty string")
    assert.has_error(function() tp.trace.svg("x.svg", { width = "wide" }) end,
      'tp.trace.svg: opts.width must be a whole number of pixels in [400, 100000], got "wide"')
    assert.has_error(function() tp.trace.svg("x.svg", { width = 0 / 0 }) end,
      "tp.trace.svg: opts.width must be a whole number of pixels in [400, 100000], got nan")
    assert.has_error(function() tp.trace.svg("x.svg", { widht = 800 }) end,
      'tp.trace.svg: unknown option "widht" (expected title, width)')
    assert.has_error(function() tp.trace.summary { quiet = "yes" } end,
      'tp.trace.summary: opts.quiet must be true or false, got "yes"')
    assert.has_error(function() tp.trace.records(-5, 1e9) end,
      "tp.trace.records: argument 1: expected a record index >= 0 (tp.trace.count()), got -5")
    assert.has_error(function() tp.trace.stats("all") end,
      "tp.trace.stats: expected a list of records (tp.trace.records()) or nothing, got string")
    assert.has_error(function() tp.trace.stats({ 5 }) end, "tp.trace.stats: expected a list of records "
      .. "(tp.trace.records()), each {start ms, end ms, category, ...}; item 1 is number")
    assert.has_error(function() tp.trace.stats({ { bogus = 1 } }) end, "tp.trace.stats: expected a list of "
      .. "records (tp.trace.records()), each {start ms, end ms, category, ...}; item 1 is a table that is not one")
  end)

  it("stats of given records: unions per category, overlap as a share of comm time, idle inside the window", function()
    local st = tp.trace.stats({
      { 0, 10, "compute" }, { 12, 30, "compute" }, { 2, 8, "compute" },   -- union 28 ms
      { 5, 20, "comm" }, { 6, 9, "comm" },                                 -- union 15 ms
      { 35, 40, "wait" },                                                  -- device time, not busy
      { 50, 60, "host" },                                                  -- not device time
    })
    assert.are.equal(28, st.compute)
    assert.are.equal(15, st.comm)
    assert.are.equal(13, st.overlapped)              -- [5, 10] and [12, 20]
    assert.are.equal(13 / 15, st.overlap)
    assert.are.equal(40, st.window)                  -- the first device op to the last: [0, 40]
    assert.are.equal(10, st.idle)                    -- [30, 40]: nothing computes or communicates
    assert.are.equal(7, st.records)
    assert.are.equal(0, tp.trace.stats({ { 0, 5, "compute" } }).overlap)   -- no comm: 0
  end)
end)

describe("tp.trace.span", function()
  after_each(function()
    tp.trace.stop()
    tp.trace.clear()
  end)

  local function spans()
    local out = {}
    for _, r in ipairs(tp.trace.records()) do
      if r[3] == "span" then out[#out + 1] = r end
    end
    return out
  end

  it("returns what the function returns, and records nothing while tracing is off", function()
    tp.trace.clear()
    local a, b = tp.trace.span("off", function(x, y) return x + 1, y end, 1, "b")
    assert.are.equal(2, a)
    assert.are.equal("b", b)
    tp.trace.start()
    assert.are.equal(0, #spans())
  end)

  it("keeps the first 4096 distinct span names, and names seen before them, past that many", function()
    local EXE = os.getenv("TPSH_EXE")
    if not EXE then return pending("needs TPSH_EXE") end
    -- in a child: the names are kept for the process, and this one's later spans need theirs
    local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
    local child = dofile(here .. "support/child_job.lua")
    local r = child.run("exec " .. child.quote(EXE) .. " --backend cpu -e " .. child.quote([[
      tp.trace.start()
      local f = function() end
      for i = 1, 4100 do tp.trace.span("s" .. i, f) end
      tp.trace.span("s7", f)
      local names = {}
      for _, r in ipairs(tp.trace.records()) do if r[3] == "span" then names[#names + 1] = r[5] end end
      print(#names, names[4096], names[4097], names[4101])]]) .. " 2>&1", 60)
    assert.are.equal(0, r.status, r.output)
    assert.truthy(r.output:find("4101\ts4096\tspan (too many distinct names)\ts7", 1, true), r.output)
  end)

  it("records a named span of host time, which may hold another", function()
    tp.trace.start()
    local t0 = tp.now()
    tp.trace.span("outer", function()
      C.usleep(2000)
      tp.trace.span("inner", function()
        tp.spin(1)
        C.usleep(3000)
      end)
    end)
    local t1 = tp.now()
    tp.synchronize()
    local s = spans()
    assert.are.equal(2, #s)
    local inner, outer = s[1], s[2]                  -- recorded as they end
    assert.are.equal("inner", inner[5])
    assert.are.equal("outer", outer[5])
    assert.are.equal(-1, outer[4])
    assert.is_true(outer[1] >= t0 and outer[2] <= t1)
    assert.is_true(inner[1] >= outer[1] + 1.5 and inner[2] <= outer[2], "inner is not inside outer")
    assert.is_true(inner[2] - inner[1] >= 2.5, "inner lasted " .. (inner[2] - inner[1]) .. " ms")
  end)

  it("is not device time: the statistics leave it out", function()
    tp.trace.start()
    tp.spin(1)
    tp.trace.span("the host waits", function()
      tp.synchronize()
      C.usleep(50000)
    end)
    tp.synchronize()
    local st = tp.trace.stats(tp.trace.records())
    assert.is_true(st.window < 40, "window " .. st.window .. " ms: the span was counted")
    assert.is_true(st.compute > 0.5 and st.compute < 40, "compute " .. st.compute)
  end)

  it("has a track of its own in the JSON and a lane of its own in the SVG", function()
    local json, svg = shared_tmp(".json"), shared_tmp(".svg")
    -- The name is written only where the box has room: the ranks start together, and the span is
    -- long enough to fill most of the window even when a loaded machine delays one rank's stop.
    tp.barrier()
    tp.trace.start()
    tp.trace.span("the whole run", function()
      tp.spin(20)
      tp.synchronize()
    end)
    tp.trace.stop()
    tp.trace.save(json)
    tp.trace.svg(svg)
    tp.barrier()
    on_rank0(function()
      local doc = decode_json(read_all(json))
      local s = read_all(svg)
      os.remove(json)
      os.remove(svg)
      local track, found = {}, {}
      for _, e in ipairs(doc.traceEvents) do
        if e.ph == "M" and e.name == "thread_name" and e.args.name == "spans" then track[e.pid] = e.tid end
      end
      for _, e in ipairs(doc.traceEvents) do
        if e.ph == "X" and e.cat == "span" then
          assert.are.equal("the whole run", e.name)
          assert.are.equal(track[e.pid], e.tid)
          found[e.pid] = e.dur
        end
      end
      for r = 0, tp.size - 1 do
        local pid = r + 1
        assert.is_number(track[pid], "rank " .. r .. " has no spans track")
        assert.is_true(found[pid] and found[pid] >= 1500, "rank " .. r .. ": span of " .. tostring(found[pid]) .. " us")
        assert.is_truthy(s:find(("rank %d  spans"):format(r), 1, true), "no spans lane for rank " .. r)
      end
      assert.is_truthy(s:find(">span<", 1, true), "no span in the legend")
      assert.is_truthy(s:find(">the whole run<", 1, true), "the span's name is not written on it")
    end)
  end)

  it("cuts a long name short on a narrow span, keeping the SVG valid UTF-8", function()
    local name = ("\195\169"):rep(40)              -- 40 x e-acute, two bytes each
    local all = { { rank = 0, streams = {}, records = {
      { 0, 100, "span", -1, "whole", "", 0, -1 }, { 0, 10, "span", -1, name, "", 0, -1 } } } }
    local s = require("tpsh.trace_svg").render(all, 0, { width = 800 })
    local label = s:match(">([^<]*)\226\128\166<")    -- the text before the ellipsis
    assert.is_string(label, "no cut label")
    assert.is_true(#label > 0 and #label < #name)
    assert.are.equal(0, #label % 2, "a character was cut in two")
    -- the box is 61 px wide: 8 characters fit, 7 of the name and the ellipsis
    assert.are.equal(14, #label)
    assert.is_truthy(s:find(">whole<", 1, true))
    assert.is_nil(s:find(">" .. name .. "<", 1, true))
  end)

  it("names the call in its errors", function()
    assert.has_error(function() tp.trace.span(1, print) end, "tp.trace.span: expected a name (string), got number")
    assert.has_error(function() tp.trace.span("x") end, "tp.trace.span: expected a function, got nil")
  end)
end)
